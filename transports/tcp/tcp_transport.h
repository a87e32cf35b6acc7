// The TCP transport: one or more stream sockets per peer
// (BRAID_NSOCKS_PERTHREAD). Posted send slots are written with sendmsg as
// [header | payload] frames, message m on socket m % sockets, so the pieces
// of a large step travel over every socket at once; a receive path reads
// each frame into its receive slot, and messages are delivered in order.
// The header's length is checked against the slot size before anything is
// read into memory.
#pragma once

#include <memory>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/table.h"

namespace braid::transport::tcp {

// The transport's row in the table: host buffers over connectPeers() with
// BRAID_NSOCKS_PERTHREAD sockets, and device buffers staged through host
// memory (tcp_device.h).
TransportEntry entry();

// Collective over `peers` (every peer listed must list this rank too):
// opens `sockets` connections per peer through the bootstrap listeners.
// After a shrink (`parent`; every rank passes one, or none does), a pair
// whose parent connection both ends gave up on cleanly carries on over its
// sockets instead, where the parent is retired. REQUIRES: every rank
// passes the same `sockets`, at least 1. Also the side connection of
// transports that set up and watch their peers over TCP (ibverbs).
std::unique_ptr<Transport> connectPeers(bootstrap::Bootstrap& bootstrap,
                                        const std::vector<int>& peers, size_t slotBytes, int slots,
                                        int sockets, net::Deadline deadline,
                                        const Parent* parent = nullptr);

}  // namespace braid::transport::tcp
