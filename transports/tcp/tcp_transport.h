// The TCP transport: one stream socket per peer. Posted send slots are
// written with writev as [header | payload] frames; a receive path reads
// each frame into the next free receive slot. The header's length is checked
// against the slot size before anything is read into memory.
#pragma once

#include <memory>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/transport.h"

namespace braid::transport::tcp {

// Collective over `peers` (every peer listed must list this rank too):
// opens one connection per peer through the bootstrap listeners.
std::unique_ptr<Transport> create(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
                                  size_t slotBytes, int slots, net::Deadline deadline);

}  // namespace braid::transport::tcp
