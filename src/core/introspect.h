// What the tools may ask a communicator that the public API does not expose.
#pragma once

#include <string>
#include <vector>

#include "braid/communicator.h"

namespace braid::detail {

// For each rank of `comm`, the transport this rank uses to reach it ("self"
// for its own rank), e.g. {"self", "tcp", "tcp"}.
std::vector<std::string> peerTransports(const Communicator& comm);

// Transports compiled into this library, e.g. {"self", "tcp"}.
std::vector<std::string> builtTransports();

}  // namespace braid::detail
