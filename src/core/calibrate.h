// The measurement behind BRAID_TUNING=measured: a token ring, a few ring
// steps and a few local kernels at communicator creation, gathered and
// fitted into the link model every rank tunes with (tuning/calibration.h).
#pragma once

#include <atomic>
#include <chrono>

#include "algorithms/simulate.h"
#include "bootstrap/bootstrap.h"
#include "exec/cpu_executor.h"
#include "transports/wiring.h"

namespace braid {

// Collective: every rank of the communicator calls it, after wiring, before
// any op. About a millisecond on shared memory with a core per rank.
// Returns `fallback` where the measurements cannot be fitted. With
// `addressFrom`, every rank (the same on all) also times its ring steps
// with pieces by address, and sets *addressFrom to the size from which
// they win (tuning::addressCrossover; 0: never); the executor is left
// sending by address from there.
algo::LinkModel calibrateLink(exec::Executor& executor, bootstrap::Bootstrap& bootstrap,
                              const transport::Wiring& wiring, std::chrono::milliseconds timeout,
                              const std::atomic<bool>& aborted, const algo::LinkModel& fallback,
                              size_t* addressFrom = nullptr);

}  // namespace braid
