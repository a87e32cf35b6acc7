// What a rank of a chaos trial does, and what it tells the driver through
// memory shared with it (multirank.h's SharedWithRanks).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "braid/braid.h"
#include "chaos/trial.h"

namespace braid::chaos {

// How far a rank got; each phase is set once, in this order.
enum class Phase : int {
  NotStarted = 0,
  Started,      // its process runs, the transport's environment is set
  WarmedUp,     // made, used and destroyed a first communicator
  Joined,       // the measured communicator is made
  PastBarrier,  // its first barrier returned
  Ended,        // finished every op, or failed
  Reported,     // destroyed the communicator and counted what is left
};

// "past its first barrier" and the like.
const char* phaseName(Phase phase);

// Text fields are written by the rank and read by the driver once the
// rank's process has ended.
struct RankReport {
  std::atomic<int> pid;
  std::atomic<int> phase;
  std::atomic<int> opsDone;
  std::atomic<int64_t> opStartNs;  // when its current op began (0: in none)
  std::atomic<int64_t> longestOpMs;
  std::atomic<int64_t> errorAtNs;  // steady clock (machine-wide); 0: no error
  std::atomic<int> errorCode;      // braid::ErrorCode
  std::atomic<int64_t> initMs, destroyMs;
  std::atomic<int> fdsBefore, fdsAfter, threadsBefore, threadsAfter;
  std::atomic<uint64_t> secret;      // the measured communicator's bootstrap secret
  std::atomic<uint64_t> warmSecret;  // ... and the warm-up communicator's
  char error[1024];                  // the braid::Error's message
  char wrong[1024];                  // a wrong result: what is wrong
  char leaked[1024];                 // what the leaked fds and threads are
};

// The whole trial's shared state, zeroed at the start of each trial.
struct SharedState {
  RankReport ranks[kMaxRanks];
  std::atomic<int> pastBarrier;    // ranks whose first barrier returned
  std::atomic<int64_t> faultAtNs;  // when the fault struck (0: not yet)
  std::atomic<int> faultOver;      // the fault struck, missed or will not come
  std::atomic<int> faultMissed;    // ... after every rank was done
  std::atomic<int> ranksGone;      // every rank's process ended
  std::atomic<int> abortNow;       // Abort: the victim's thread aborts now
  std::atomic<int> aborted;        // ... and it did (abort() returned)
  std::atomic<int> idReady;        // the measured communicator's id is in `id`
  unsigned char id[sizeof(UniqueId::bytes)];
};

int64_t nowNs();

// Sets the trial's transport in this process's environment (before any
// communicator is made) and, for device buffers, selects the emulated
// device. Runs in each rank's process, after it entered its host.
void enterTransport(const Trial& trial);

// The environment enterTransport sets, as "NAME=value NAME=value".
std::string transportEnvironment(const Trial& trial);

// Rank `rank`'s whole part of the trial: the warm-up communicator (from
// `id`), the measured one (from an id rank 0 makes with `idConfig` and
// passes on through `shared`), the first barrier, the ops with their
// checks, the fault's effects, the teardown and the count of what is left.
// Reports into shared->ranks[rank]; returns normally whatever braid did
// (only a broken harness throws).
void runRank(const Trial& trial, int rank, const UniqueId& id, const Config& config,
             const Config& idConfig, SharedState* shared);

}  // namespace braid::chaos
