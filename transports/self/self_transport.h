// The "self" transport: a rank's connection to itself, a FIFO in local memory.
// Used for send/recv to one's own rank inside a group.
#pragma once

#include <memory>

#include "transports/transport.h"

namespace braid::transport::self {

std::unique_ptr<Transport> create(int rank, size_t slotBytes, int slots);

}  // namespace braid::transport::self
