// Alpha-beta costs per transport, for predicting a plan's time (the
// simulator's LinkModel). Defaults only, for now: the orders of magnitude
// measured on a 2-vCPU AMD EPYC host (shared memory: a hop of ~0.15 us
// including the call, ~12 GB/s per process copying; TCP over loopback: tens
// of microseconds and a few GB/s); not yet refined by a measurement at
// communicator creation.
#pragma once

#include <string>

#include "algorithms/simulate.h"

namespace braid::tuning {

// The link model of `transport` ("shm", "tcp", ...); unknown names get tcp's.
algo::LinkModel defaultLink(const std::string& transport);

}  // namespace braid::tuning
