// The CPU executor: runs plans over connections on the calling thread.
// Also what both executors name an op by (OpInfo) and what a hang report
// reads (Activity).
//
// A Lane is one op's plan bound to its host buffers (lanes.h). The lanes of
// a group run together, each advancing through its own steps in order; a
// connection direction is used by one lane at a time, in the order the
// lanes were issued (Turns), so the messages of two ops never interleave on
// a connection. Waiting spins briefly, then sleeps in the transports; every
// wait has a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.h"
#include "braid/types.h"
#include "core/memory.h"
#include "exec/lanes.h"
#include "reduce/reduce.h"
#include "transports/wiring.h"

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

// Moves the calling thread from its CPU to another of the CPUs it may
// use, which stay what they were. Returns the CPU it left, or -1 where it
// did not move (it may use only one).
int leaveCpu();

// One op's plan bound to host buffers, advancing through its steps.
struct Lane {
  const algo::Plan* plan = nullptr;
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  std::byte* scratch = nullptr;  // its area of the executor's scratch (scratchOf), set by run()
  size_t elemSize = 1;
  DataType type = DataType::Uint8;
  ReduceOp op = ReduceOp::Sum;
  reduce::Kernel kernel = nullptr;  // set when the plan reduces
  int nranks = 1;                   // Avg's divisor
  uint32_t tag = 0;                 // carried by every message of this op
  const OpInfo* info = nullptr;
  // The memAlloc() regions that hold input and output, if any: pieces sent
  // from there may go by reference (Executor's referenceBytes). The input's
  // only when it does not overlap the output (the op never writes it).
  memory::Region inputRegion, outputRegion;
  // No op of the group writes the input: pieces of it may be lent to a
  // peer that reads them by address (Connection::postAddress).
  bool inputSettled = false;
  // The output is larger than the cache: what the op will not read again
  // goes there with streaming stores (reduce/streaming.h).
  bool streamOutput = false;

  // Progress, owned by the executor.
  size_t step = 0;
  size_t done = 0;  // bytes of the current step already moved
};

// What an executor is doing, for hang reports (core/diagnose.h). The thread
// running ops writes it with relaxed stores (when an op starts, when it
// first has to wait, when it ends), never allocating; any thread may read
// it. A reading taken while it changes may mix two moments.
struct Activity {
  std::atomic<const char*> name{nullptr};  // the running op's name, a literal; null: none
  std::atomic<uint64_t> seq{0};
  std::atomic<size_t> count{0};
  std::atomic<int> type{0}, op{0}, root{-1}, peer{-1};
  std::atomic<bool> reduces{false};
  std::atomic<size_t> lanes{0};                 // lanes running together (a group's ops)
  std::atomic<size_t> step{0}, steps{0};        // of the op named above
  std::atomic<int> recvPeer{-1}, sendPeer{-1};  // of that step, -1: none
  std::atomic<int64_t> waitingSince{0};         // steady-clock ns since epoch; 0: not waiting

  // An op starts: its name and number only (the latency path pays for
  // little more); steps stays 0 until it first waits.
  void begin(const OpInfo& info) {
    seq.store(info.seq, std::memory_order_relaxed);
    steps.store(0, std::memory_order_relaxed);
    waitingSince.store(0, std::memory_order_relaxed);
    name.store(info.name, std::memory_order_release);
  }
  // The op of `info` waits: everything about it.
  void describe(const OpInfo& info, size_t steps, size_t lanes);
};

class Executor {
 public:
  const Activity& activity() const { return activity_; }
  // The op that failed is over: hang reports no longer show it (once the
  // failure's own report, if any, is written).
  void forgetFailedOp() { activity_.name.store(nullptr, std::memory_order_relaxed); }

  // `wiring` outlives the executor. Every message is at most `pieceBytes`
  // (one slot), the same on every rank and every transport. `spinFirst`:
  // an idle wait may busy-spin a few microseconds before it yields the core
  // (false when this host has more ranks than cores). Pieces of at least
  // `referenceBytes` (0: none) that lie in a lane's region go by reference
  // where the connection carries references.
  // `revoked`: set (with the `aborted` that run() is given) when this rank
  // revoked the communicator: ops then fail with Revoked, not Aborted.
  Executor(transport::Wiring& wiring, int rank, size_t pieceBytes, bool spinFirst,
           size_t referenceBytes, const std::atomic<bool>& revoked);

  // Whether any lane's regions could be used: worth looking them up.
  bool usesReferences() const { return referenceBytes_ != 0; }
  // Pieces of at least `bytes` (0: none) go by address where the peer
  // reads them so (Connection::carriesAddresses): the communicator sets it
  // from BRAID_CMA_BYTES or from what it measured at creation.
  void sendByAddressFrom(size_t bytes) { addressFrom_ = bytes; }
  // Whether pieces copied into a peer's slot are written with streaming
  // stores (reduce/streaming.h): they then reach the peer through memory
  // rather than from this core's cache.
  void streamSlots(bool on) { streamSlots_ = on; }
  size_t addressFrom() const { return addressFrom_; }
  // Whether some peer reads this rank's pieces by address.
  bool carriesAddresses() const { return carriesAddresses_; }
  // Whether pieces may go by address: worth telling lanes' settled inputs
  // apart.
  bool usesAddresses() const { return addressFrom_ != 0 && carriesAddresses_; }
  uint64_t piecesSentByReference() const { return piecesSentByReference_; }
  uint64_t piecesSentByAddress() const { return piecesSentByAddress_; }
  uint64_t piecesStreamedToSlots() const { return piecesStreamedToSlots_; }
  // After run() threw: the rank to blame (the peer that failed, or the one a
  // closing peer blamed, or the one waited for at a timeout); -1 if unknown.
  int blamedRank() const { return blamed_; }
  // Why: the blamed rank failed, stopped answering (a timeout) or revoked
  // the communicator.
  transport::GiveUpReason blamedReason() const { return blamedReason_; }

  // Runs every lane to completion and waits until this rank's messages are
  // on their way. Throws braid::Error whose message names this rank, the
  // op and the peer: RemoteError when a connection failed, Timeout past the
  // deadline, Aborted once `aborted` is set, Internal when a message does
  // not match the op (a mismatched collective).
  // The op fails with Timeout when it is still waiting `timeout` after it
  // first had to wait.
  void run(Lane* lanes, size_t count, std::chrono::milliseconds timeout,
           const std::atomic<bool>& aborted);

  // A receive from any source, before it runs: waits until some peer's
  // oldest unread message is its next point-to-point message to this rank,
  // and returns that peer. The message from `peer` matches when its tag
  // agrees with `tags[peer]` on the bits of `mask` (0 in tags: not a
  // candidate). Candidates are looked at in turn from `first`, so that
  // none is starved. Throws as run() does (`info` names the op): Aborted,
  // Timeout `timeout` after it first waited (blaming nobody), RemoteError
  // when a connection failed or every candidate closed its connection with
  // nothing left for this rank.
  int awaitSender(const OpInfo& info, const std::vector<uint32_t>& tags, uint32_t mask, int first,
                  std::chrono::milliseconds timeout, const std::atomic<bool>& aborted);

 private:
  bool advance(Lane& lane);
  bool progressTransports();
  void prepareToWait();
  // The lowest-ranked peer that last ran on this rank's CPU, or -1
  // (Transport::cpuSharingPeer).
  int cpuSharingPeer() const;
  // Moves this thread off its CPU, which it shares with `peer`, to another
  // of those it may use, unless it did so less than kLeaveInterval ago; the
  // set of CPUs it may use stays as it was. Returns whether it moved.
  bool leaveSharedCpu(Clock::time_point now, int peer);
  void waitForActivity(Clock::time_point until);
  bool flushed() const;
  // The region from which the piece `data` that `step` sends may be lent to
  // the peer in place, or null when it must be copied.
  const memory::Region* lentFrom(const Lane& lane, const algo::Step& step, const std::byte* data,
                                 size_t bytes, const transport::Connection& out) const;
  // Whether the piece `data` that `step` sends may be lent to the peer by
  // its address.
  bool lentByAddress(const Lane& lane, const algo::Step& step, const std::byte* data, size_t bytes,
                     const transport::Connection& out) const;
  // Whether `step` may lend its piece at all: it lies in the op's input,
  // which the group never writes, or in output the plan has settled, from a
  // step that streams several pieces.
  bool lendable(const Lane& lane, const algo::Step& step, bool inputSettled) const;
  // Forgets the connections whose receivers released every lent piece;
  // true when none is left.
  bool allReturned();
  void noteLent(const transport::Connection* connection, uint64_t ticket, int peer);
  [[noreturn]] void failClosed(const OpInfo& info, int peer, const char* doing);
  // The op `info` stops: the communicator was aborted, or revoked here.
  [[noreturn]] void failAborted(const OpInfo& info);
  // Fails the op `info` when a peer closed its connection saying that the
  // communicator was revoked, whichever peers the op waits for.
  void failIfRevoked(const OpInfo& info);
  // Fails the op `info`, every step of which is done, when a peer that has
  // yet to take its last messages gave up on the communicator, or one yet
  // to finish reading memory this rank lent it closed or died: it never
  // will.
  void failIfAbandoned(const OpInfo& info);
  // What this rank waits for in an op that cannot move: the first lane with
  // steps left and its peer, or (lane null) the peer still reading memory
  // this rank lent; peer -1 when it only waits to flush.
  struct Wait {
    const Lane* lane = nullptr;
    int peer = -1;
    bool receiving = false;
    bool lent = false;  // no lane left: the peer still reads this rank's memory
  };
  Wait waitOf(const Lane* lanes, size_t count);
  // Past the deadline: tells the peers whom this rank waits for, following
  // the chain of such notices (the peer waited for may itself wait for
  // another rank) as far as they reach.
  void followWaits(const Lane* lanes, size_t count);
  void announceWaitingFor(int rank);
  [[noreturn]] void failStalled(const Lane* lanes, size_t count, Clock::duration waited,
                                std::chrono::milliseconds timeout);

  transport::Wiring& wiring_;
  int rank_;
  size_t pieceBytes_;
  bool spinFirst_;  // this host has a core per rank
  // How long an idle wait busy-spins before yielding. It adapts: it grows
  // while peers answer quickly and shrinks while spins end unanswered
  // (another process wants this core).
  Clock::duration pureSpin_;
  void adaptSpin(Clock::duration waited);
  std::vector<transport::Transport*> waitable_;  // transports that can block a waiter
  std::vector<transport::Transport*> active_;    // transports that progress() must drive
  struct Unflushable {                           // a connection of an active transport
    const transport::Connection* connection;
    int peer;
  };
  std::vector<Unflushable> unflushable_;
  std::vector<std::byte> scratch_;  // the lanes' scratch areas, back to back; only grows
  size_t referenceBytes_;
  // Connections with pieces posted by reference that the receiver has not
  // released yet: the op is not done before they are (the caller may then
  // change them). Nothing writes them meanwhile: lentFrom() lends only
  // memory the op does not write again.
  struct Lent {  // the newest piece lent on a connection
    const transport::Connection* connection;
    uint64_t ticket;
    int peer;
  };
  std::vector<Lent> lent_;
  uint64_t piecesSentByReference_ = 0;
  uint64_t piecesSentByAddress_ = 0;
  uint64_t piecesStreamedToSlots_ = 0;
  Clock::time_point nextLeave_{};  // leaveSharedCpu() waits until then
  size_t addressFrom_ = 0;
  bool streamSlots_ = false;
  bool carriesAddresses_ = false;
  // A piece read by address that a reduction combines, before it does (or
  // that lands in the result after, see advance()): stagingFor(source,
  // bytes) gives room for it at the source's offset in a page, where the
  // kernel's copy is fastest.
  std::byte* stagingFor(const std::byte* source, size_t bytes);
  std::vector<std::byte> staging_;
  Activity activity_;
  int blamed_ = -1;
  transport::GiveUpReason blamedReason_ = transport::GiveUpReason::Failed;
  int waitingFor_ = -1;  // the rank this rank last told its peers it waits for
  const std::atomic<bool>& revoked_;
};

}  // namespace braid::exec
