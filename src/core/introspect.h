// What the tools may ask a communicator that the public API does not expose.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/simulate.h"
#include "braid/communicator.h"

namespace braid::detail {

// For each rank of `comm`, the transport this rank uses to reach it ("self"
// for its own rank), e.g. {"self", "tcp", "tcp"}.
std::vector<std::string> peerTransports(const Communicator& comm);

// For each rank of `comm`, how device buffers reach it from this rank, e.g.
// {"self", "cuda_ipc: same device", "nvlink_p2p: peer access"}, or
// why they cannot; empty when the communicator has no device.
std::vector<std::string> peerDevicePaths(const Communicator& comm);

// The transports compiled into this library, in the transport table's
// order (transports/table.h).
std::vector<std::string> builtTransports();
// "" when this process could use the transport `name`, else why not (not
// built, no library, no device, no such transport).
std::string transportStatus(const std::string& name);

// The data parts this rank posted on each stripe of its connection to
// `peer` (the QPs a verbs connection stripes over); empty where the
// connection has one.
std::vector<uint64_t> stripePosts(const Communicator& comm, int peer);

// How many pieces this rank has sent as references to its memAlloc memory
// (read in place by the peer) rather than as copies.
uint64_t piecesSentByReference(const Communicator& comm);
// How many pieces this rank has sent as their address, which the peer read
// from this process (Connection::postAddress), and from which size it
// sends them so (0: none; BRAID_CMA_BYTES, or measured at creation).
uint64_t piecesSentByAddress(const Communicator& comm);
size_t addressFrom(const Communicator& comm);
// How many pieces this rank has written into peers' slots with streaming
// stores (tuning::CopyPath::StreamedSlots).
uint64_t piecesStreamedToSlots(const Communicator& comm);
// Whether large ops choose how their pieces cross as they run (through
// slots, streamed slots or by address), the measured size being only the
// first guess (tuning/copy_choice.h).
bool copyPathAdapts(const Communicator& comm);
// For each rank of `comm`, how host buffers' pieces can travel from this
// rank to it (Connection::copyPaths: "slots, by address"; "" for itself).
std::vector<std::string> peerCopyPaths(const Communicator& comm);

// The catalog's name (algo::algorithmName; braid-info --algorithms lists
// them) of the algorithm of this rank's most recent operation, and of its
// most recent one on device buffers.
std::string lastAlgorithm(const Communicator& comm);
std::string lastDeviceAlgorithm(const Communicator& comm);

// The link model `comm` picks algorithms with (measured at creation under
// BRAID_TUNING=measured); false under BRAID_TUNING=fixed.
bool tuningLink(const Communicator& comm, algo::LinkModel* link);

}  // namespace braid::detail
