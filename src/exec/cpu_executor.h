// The CPU executor: runs plans over connections on the calling thread.
//
// A Lane is one plan bound to its buffers. Lanes run together (a group):
// each advances through its own steps in order; a connection direction is
// used by one lane at a time, in the order the lanes were issued, so the
// messages of two ops never interleave on a connection. Waiting spins
// briefly, then sleeps in the transports; every wait has a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.h"
#include "braid/types.h"
#include "reduce/reduce.h"
#include "transports/registry.h"

namespace braid::exec {

using Clock = std::chrono::steady_clock;

// What an op is, for error messages: "allReduce #12 (count 1024, float32, sum)".
struct OpInfo {
  const char* name = "";
  uint64_t seq = 0;
  size_t count = 0;
  DataType type = DataType::Uint8;
  ReduceOp op = ReduceOp::Sum;
  bool reduces = false;
  int root = -1;
  int peer = -1;

  std::string describe() const;
};

struct Lane {
  const algo::Plan* plan = nullptr;
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  std::byte* scratch = nullptr;  // kScratchBytes of the executor's, set by run()
  size_t elemSize = 1;
  DataType type = DataType::Uint8;
  ReduceOp op = ReduceOp::Sum;
  reduce::Kernel kernel = nullptr;  // set when the plan reduces
  int nranks = 1;                   // Avg's divisor
  uint32_t tag = 0;                 // carried by every message of this op
  const OpInfo* info = nullptr;

  // Progress, owned by the executor.
  size_t step = 0;
  size_t done = 0;  // bytes of the current step already moved
};

class Executor {
 public:
  // `wiring` outlives the executor. Every message is at most `pieceBytes`
  // (one slot), the same on every rank and every transport. `spinFirst`:
  // an idle wait may busy-spin a few microseconds before it yields the core
  // (false when this host has more ranks than cores).
  Executor(transport::Wiring& wiring, int rank, size_t pieceBytes, bool spinFirst);

  // Runs every lane to completion and waits until this rank's messages are
  // on their way. Throws braid::Error whose message names this rank, the
  // op and the peer: RemoteError when a connection failed, Timeout past the
  // deadline, Aborted once `aborted` is set, Internal when a message does
  // not match the op (a mismatched collective).
  // The op fails with Timeout when it is still waiting `timeout` after it
  // first had to wait.
  void run(Lane* lanes, size_t count, std::chrono::milliseconds timeout,
           const std::atomic<bool>& aborted);

 private:
  bool advance(Lane& lane);
  bool progressTransports();
  void prepareToWait();
  void waitForActivity(Clock::time_point until);
  bool flushed() const;
  [[noreturn]] void failClosed(const Lane& lane, int peer, const char* doing);
  [[noreturn]] void failStalled(const Lane* lanes, size_t count, std::chrono::milliseconds timeout);

  transport::Wiring& wiring_;
  int rank_;
  size_t pieceBytes_;
  // How long an idle wait busy-spins before yielding. It adapts: it grows
  // while peers answer quickly and shrinks while spins end unanswered
  // (another process wants this core).
  Clock::duration pureSpin_;
  void adaptSpin(Clock::duration waited);
  std::vector<transport::Transport*> waitable_;  // transports that can block a waiter
  std::vector<transport::Transport*> active_;    // transports that progress() must drive
  std::vector<std::byte> scratch_;               // algo::kScratchBytes per lane
};

}  // namespace braid::exec
