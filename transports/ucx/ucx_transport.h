// The UCX transport: one UCP context and one UCP worker per communicator
// (thread mode SINGLE: the executor drives a transport from one thread at a
// time), one endpoint per peer, and every message a tagged send into a
// receive that the peer posted into its own slot memory. The receiver owns
// its slots; a sender's slot stays in flight until a posted receive of the
// peer has taken its message, so how many receives a rank posts is the
// credit its peer has. UCX picks the wire (shared memory, TCP, RDMA) from
// its own environment (UCX_TLS, UCX_NET_DEVICES), which braid leaves alone.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/transport.h"

namespace braid::transport::ucx {

// Collective over every rank of `bootstrap` (each calls it, also one that
// serves no peer over UCX): opens this rank's context and worker, exchanges
// worker addresses through the bootstrap's allgather, makes an endpoint to
// each of `peers` (every peer listed must list this rank too) and waits
// until each has answered. Returns nullptr, with `*whyNot` naming the rank
// that could not start UCX or reach a peer and why (the same on every
// rank), so that all ranks can fall back together. Throws Error(Timeout)
// past `deadline`.
std::unique_ptr<Transport> create(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
                                  size_t slotBytes, int slots, net::Deadline deadline,
                                  std::string* whyNot);

}  // namespace braid::transport::ucx
