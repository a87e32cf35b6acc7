// Alpha-beta costs per transport, for predicting a plan's time (the
// simulator's LinkModel). These defaults are the orders of magnitude
// measured on a 2-vCPU AMD EPYC host (shared memory: ~0.15 us a hop
// including the call, ~12 GB/s per process copying across cores; TCP over
// loopback: tens of microseconds and a few GB/s). Under BRAID_TUNING=measured
// a communicator measures its own at creation (tuning/calibration.h) and
// uses these only where it cannot.
#pragma once

#include <string>

#include "algorithms/simulate.h"

namespace braid::tuning {

// The link model of `transport` ("shm", "tcp", "cuda_ipc" for device
// FIFOs, "tcp_staged" for device FIFOs between hosts, ...); unknown names
// get tcp's.
algo::LinkModel defaultLink(const std::string& transport);

}  // namespace braid::tuning
