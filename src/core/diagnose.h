// Hang reports. Every live communicator is registered here; on SIGUSR1
// (kill -USR1 <pid>) a background thread logs one line per communicator of
// the process:
//
//   braid[rank 1 pid 4242 exec] warn: hang report (SIGUSR1): rank 1 of 4:
//     collectives issued 812, completed 811, 0 async ops queued; in
//     allReduce #811 (count 1024, float32, sum), step 3 of 6, receiving
//     from rank 0, sending to rank 2, waiting for 12.3 s
//
// "issued" counts the collectives the caller started, "completed" those that
// finished on this rank: a rank whose issued count is lower than its peers'
// has not called the collective they wait in. The step line says which
// message the rank waits for. BRAID_DUMP_ON_TIMEOUT=1 logs the same line
// when an op times out. Installing the handler keeps SIGUSR1 from killing
// the process; a handler the program had installed before still runs.
#pragma once

#include "core/communicator_impl.h"

namespace braid::diagnose {

// Called by Communicator::Impl's constructor and destructor. The first
// registration in a process installs the SIGUSR1 handler and the thread.
void add(const Communicator::Impl* impl);
void remove(const Communicator::Impl* impl);

// Logs `impl`'s line now, with `why` ("SIGUSR1", "timed out").
void report(const Communicator::Impl& impl, const char* why);

// Logs every registered communicator's line.
void reportAll(const char* why);

}  // namespace braid::diagnose
