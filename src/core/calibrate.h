// The measurement behind BRAID_TUNING=measured: a few exchanges with a
// partner rank and a few local kernels at communicator creation, gathered
// and fitted into the link model every rank tunes with (tuning/calibration.h).
#pragma once

#include <atomic>
#include <chrono>

#include "algorithms/simulate.h"
#include "bootstrap/bootstrap.h"
#include "exec/cpu_executor.h"
#include "transports/registry.h"

namespace braid {

// Collective: every rank of the communicator calls it, after wiring, before
// any op. Ranks pair up (0 with 1, 2 with 3, ...; an odd last rank only
// takes part in the gathering). About a millisecond on shared memory.
// Returns `fallback` where the measurements cannot be fitted.
algo::LinkModel calibrateLink(exec::Executor& executor, bootstrap::Bootstrap& bootstrap,
                              const transport::Wiring& wiring, std::chrono::milliseconds timeout,
                              const std::atomic<bool>& aborted, const algo::LinkModel& fallback);

}  // namespace braid
