// The device executor: runs plans on device buffers by lowering every step
// to stream-ordered operations on the caller's stream, NCCL's semantics:
// the call returns once the plan is enqueued.
//
// A step is cut into pieces of one device slot, the same cut as the peer
// makes, and each piece becomes: a batch of flag waits (the data has
// arrived; the peer's slot is free), one kernel (a copy, or a reduction
// written straight into the peer's slot, recvReduceSend fused), and a
// batch of flag writes (filled at the peer; credit back to the sender),
// merged with the next piece's waits. No kernel ever spins waiting for a
// peer, so any number of ranks can share one GPU.
//
// Ops of one communicator run one after another on the device, whatever
// streams they were issued on: an op issued on another stream than the
// previous one first waits for it (an event). In a group, the collectives
// come first (every rank issues them in the same order), each lowered
// whole before the next, as if issued alone; then the sends and receives,
// piece by piece in turns (lanes.h), the sends on a stream of the
// executor's own that forks from the caller's stream and joins it again.
// A send then waits only for credit and a receive only for data, so
// grouped sends and receives in any order cannot deadlock.
//
// A mapped plan's direct steps (algorithms/plan.h) are kernels too: an
// n-input reduction over every rank's buffer, or a copy into or out of a
// peer's; its Signals are empty messages through the FIFOs, a round of
// them lowered as all its messages posted, then all its waits. In a group
// such a plan is lowered alone, between the collectives before and after
// it. So a direct op waits, fails and is released like any other.
//
// A watchdog thread (device_watchdog.cc) completes each op's Work once the
// stream has passed it, and fails ops: when a peer dies, aborts or says it
// gave up, when the communicator is aborted, or when an op runs past the
// timeout after the stream reached it. A failed op releases the waits its
// stream is blocked on (it writes this rank's counters from the host, again
// until the stream has passed every op), so no stream stays blocked; the
// failure is sticky.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "algorithms/plan.h"
#include "braid/error.h"
#include "device/device.h"
#include "exec/cpu_executor.h"
#include "transports/device_transport.h"

namespace braid::exec {

// One op's plan bound to device buffers (all on the communicator's
// device), lowered step by step (lanes.h).
struct DeviceLane {
  const algo::Plan* plan = nullptr;
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  DataType type = DataType::Uint8;
  ReduceOp op = ReduceOp::Sum;
  int nranks = 1;             // Avg's divisor
  bool pointToPoint = false;  // a send or a receive, not a collective
  uint32_t tag = 0;           // carried by every message of the op (see device_transport.h)
  OpInfo info;
  // A mapped plan's view of every rank's buffers (index: rank; this rank's
  // are its own input and output): where its direct steps read and write.
  std::vector<const std::byte*> peerInputs;
  std::vector<std::byte*> peerOutputs;

  // Lowering progress, owned by the executor.
  size_t step = 0;
  size_t done = 0;  // bytes of the current step already lowered
  // Its area of the executor's scratch (scratchOf), set when enqueued.
  std::byte* scratch = nullptr;
};

class DeviceExecutor {
 public:
  // Called once per op from the watchdog thread: null when it completed,
  // else its error (each Work makes its own copy: no exception object is
  // shared between threads).
  using Done = std::function<void(const Error*)>;
  // Called once, from the thread that first saw it, with the sticky error
  // and whom it blames (-1: nobody) for which reason.
  using OnFailure = std::function<void(const Error&, int blamed, transport::GiveUpReason reason)>;

  DeviceExecutor(device::Device& device, std::unique_ptr<transport::DeviceTransport> transport,
                 int rank, int nranks, int deviceIndex, const std::atomic<int64_t>& timeoutMs,
                 const std::atomic<bool>& aborted, const std::atomic<bool>& revoked,
                 OnFailure onFailure);
  // Waits until every op completed or failed (a stuck one fails at its
  // deadline), tells the peers this rank leaves, and frees everything.
  ~DeviceExecutor();

  const transport::DeviceTransport& transport() const { return *transport_; }
  // Blocks until every op enqueued so far completed or failed.
  void waitIdle();
  // For hang reports: how many ops the device has not passed and where the
  // oldest one's stream is stuck, read from the counters now (also waits
  // for this rank's own messages); "" when the device is idle.
  std::string describeStuck();
  // Whether device ops can reach `peer`.
  bool reaches(int peer) const;

  // Lowers the lanes onto streams[0] (the other streams of a group join it
  // before and wait for it after) and returns; `done` runs once the device
  // passed them. Throws the sticky error when the executor failed earlier
  // (nothing is enqueued then); InvalidUsage when a lane's plan names a
  // peer no device transport serves.
  void enqueue(DeviceLane* lanes, size_t count, const device::StreamHandle* streams,
               size_t streamCount, Done done);

  // Lowers lanes issued on `stream` while it is being captured into a
  // graph, so that every replay of the graph runs them anew: on the graph
  // FIFOs, whose counters live in device memory and advance on the device
  // (FlagOp's relative values), each op padded with empty messages to a
  // whole number of laps of the slots, so that every op starts at slot 0.
  // Nothing is tracked: the host never sees a replay. Every rank must
  // replay its graphs in the same order, one at a time per communicator
  // (NCCL's rule too); tags are not checked in graphs. Throws InvalidUsage
  // naming what cannot be captured: a peer the graph FIFOs do not reach
  // (one staged over tcp), or grouped sends and receives (which need a
  // second stream). REQUIRES: hasGraphFifos().
  void enqueueCaptured(DeviceLane* lanes, size_t count, device::StreamHandle stream);

  // A wait of one-sided work: the stream waits until `flag`, this rank's
  // counter of the raises of signal `signal` by rank `peer`, reaches
  // `value` (cyclically). Signal -1: the flag counts this rank's calls to
  // `peer` sent through the network so far.
  struct BoardWait {
    uint32_t* flag = nullptr;
    uint32_t value = 0;
    int peer = -1;
    int signal = 0;
    // Non-null: `peer` raises the flag through a connection of its own,
    // read to its end once this is true; until then its departure says
    // nothing about raises still on their way.
    const std::atomic<bool>* drained = nullptr;
  };
  // One-sided work on device windows (Communicator::put, signal and
  // waitSignals): a copy of `bytes` from `src` to `dst` (none when 0), then
  // `flags`, then the flag waits of `waits`, on `stream`, tracked as an op:
  // after the ops before it, `done` once the stream passed it. It fails
  // past the timeout naming the signal its stream waits for, or when that
  // peer leaves; a failure releases its waits (their values written from
  // the host). `reached`, when not null, is recorded once the stream
  // reached the work. Throws the sticky error when the executor failed
  // earlier (nothing is enqueued then).
  void enqueueOneSided(const OpInfo& info, device::StreamHandle stream, void* dst, const void* src,
                       size_t bytes, const std::vector<device::FlagOp>& flags,
                       std::vector<BoardWait> waits, Done done,
                       device::EventHandle reached = nullptr);
  // Fails every outstanding op with `error`, blaming `blamed`: for work
  // done beside the device (a one-sided call sent through the network)
  // that failed.
  void failWith(const Error& error, int blamed);
  // The graph FIFOs: made by the communicator (collectively, at its
  // creation), of the ordinary FIFOs' shape, so that every plan fits them.
  bool hasGraphFifos();
  void setGraphFifos(std::unique_ptr<transport::DeviceTransport> graphs);

  // Device memory it holds: scratch it can free between ops (releasable),
  // and what it keeps: the graph FIFOs' counters, captured ops' scratch and
  // every transport's device FIFOs (persistent).
  struct Memory {
    size_t releasable = 0;
    size_t persistent = 0;
  };
  Memory memory();
  // Once every op enqueued so far is done: frees the ops' scratch, and
  // returns its size (the next op makes it again, as big as it needs).
  size_t releaseScratch();
  // Makes the ops' scratch `bytes` (or more) again at once.
  void restoreScratch(size_t bytes);

 private:
  // What one enqueue() put on the stream: the lanes of a group, or one op's
  // lane, tracked as one from its begin to its end (info: its first lane's).
  struct Op {
    OpInfo info;
    device::EventHandle begin = nullptr;     // the stream reached the op
    device::EventHandle end = nullptr;       // the stream passed it
    std::vector<device::EventHandle> joins;  // other streams' events of a group
    // Per peer the op talks to: the counters it must reach by its end.
    struct Target {
      int peer;
      uint64_t received;
      uint64_t sent;
    };
    std::vector<Target> targets;
    // The messages it receives, per peer, as runs of one lane's tag: a
    // failed op's release answers the tag wait its stream is stuck at.
    struct Received {
      int peer;
      uint64_t first, last;  // message numbers [first, last)
      uint32_t tag;
    };
    std::vector<Received> received;
    // The waits its pieces were lowered with, in stream order: for the
    // next message from `peer` (number `message`, tagged `tag`) to arrive,
    // or for the peer to free a slot for the next one to it. The first that
    // does not hold is what the stream is stuck at (checkDeadline).
    struct Wait {
      int peer;
      bool data;
      uint32_t tag;
      uint64_t message;
    };
    std::vector<Wait> waits;
    std::vector<BoardWait> boardWaits;  // one-sided work's signal waits
    Done done;
    std::optional<Clock::time_point> startedAt;   // when the watchdog saw `begin` complete
    std::optional<Clock::time_point> graceUntil;  // past the deadline: when it fails
  };

  // After `op`'s enqueueing on `stream` threw `error` (mutex_ held): the
  // communicator fails, the op is tracked to its end so that the watchdog
  // releases what part of it was enqueued, and the failure is thrown.
  [[noreturn]] void failEnqueue(Op op, device::StreamHandle stream, const std::exception& error,
                                std::unique_lock<std::mutex>& lock);
  // Makes the ops' scratch `bytes`, retiring the old area (mutex_ held).
  void growScratch(size_t bytes);

  // ---- Lowering (device_executor.cc): the issuing thread, mutex_ held.
  void lower(DeviceLane* lanes, size_t count, device::StreamHandle stream, Op* op);
  // Lowers `lanes` (one collective, or a group's sends and receives) in
  // turns; the sends of point-to-point lanes go to `sends` (the caller's
  // stream when null).
  void lowerInTurns(DeviceLane* lanes, size_t count, device::StreamHandle stream,
                    device::StreamHandle sends);
  void lowerPiece(DeviceLane& lane, device::StreamHandle stream);
  // A mapped plan's steps (lowered alone): a run of Signals, and the
  // direct kernels.
  void lowerSignals(DeviceLane& lane);
  // The flag writes that hand the next message to `peer` (`bytes` long,
  // of the op tagged `tag`), once the work before them ran; and those that
  // give the next message from `peer` back.
  void postMessage(int peer, uint32_t tag, size_t bytes);
  // The flag waits before a piece that takes the next message from `peer`
  // (tagged `tag`: of the lane's op), or that sends it the next one (a
  // slot free at the peer); noted in the op being lowered.
  void awaitData(int peer, uint32_t tag);
  void awaitCredit(int peer);
  void releaseMessage(int peer);
  // The op being lowered receives message number `message` from `peer`,
  // tagged `tag`: it extends the last run of its received messages, or
  // starts one (what releaseWaits() answers if the op fails).
  void noteReceived(int peer, uint64_t message, uint32_t tag);
  // The device counters a captured op's flag values are relative to (null
  // on the ordinary FIFOs, whose values are absolute).
  const uint32_t* sent(int peer) const { return ch_->sent ? ch_->sent + peer : nullptr; }
  const uint32_t* received(int peer) const {
    return ch_->received ? ch_->received + peer : nullptr;
  }
  void lowerDirect(DeviceLane& lane, device::StreamHandle stream);
  // Enqueues the flag operations gathered so far (on the stream they were
  // gathered for).
  void flushFlags();
  device::StreamHandle sendStream();
  void ensureScratch(DeviceLane* lanes, size_t count);
  device::EventHandle takeEvent();

  // A message counter's low 32 bits: what a device flag holds.
  static uint32_t low(uint64_t counter) { return static_cast<uint32_t>(counter); }

  // ---- The watchdog (device_watchdog.cc): its own thread, mutex_ held
  // but while it waits for work or for a running op, or runs an op's Done.
  void watch();
  // One turn: completes, fails and releases ops; false once it should stop.
  bool watchTurn(std::unique_lock<std::mutex>& lock);
  // Completes every op with the failure, without the device (it broke).
  void abandonOps(std::unique_lock<std::mutex>& lock);
  // Fails every outstanding op with `error` (once), announcing it to the
  // peers; `blamed` and `reason` say whom they should name. Also called
  // by a failed enqueue (mutex_ held there too).
  void failAll(const Error& error, int blamed, transport::GiveUpReason reason);
  // RemoteError when the head op waits for a peer that left cleanly: all
  // it will ever write has been written, so what is missing never comes.
  std::optional<Error> checkDeparted(const Op& head, int* blamed);
  // After a failure: writes from the host the counters and the tags this
  // rank's streams wait for, so that every wait enqueued so far passes.
  void releaseWaits();
  // After a failure: releases every wait of a graph replay, now and for
  // replays still to come (the abort word; nothing a peer writes undoes it).
  void releaseGraphWaits();
  // The head op's Timeout, once it is past its deadline and a short grace
  // in which this rank tells its peers whom it waits for and follows what
  // they say (the rank it waits for may wait for another in turn); the
  // rank to blame in *blamed.
  std::optional<Error> checkDeadline(Op& head, int* blamed);
  // Where `head`'s stream is stuck (stuckAt()): the peer it waits for (-1:
  // none found) and what for; `foreignTag` when the message it waits at is
  // another op's.
  struct Stuck {
    int peer = -1;
    std::string where = "waiting on the device";
    std::optional<uint32_t> foreignTag;
  };
  Stuck stuckAt(const Op& head, bool ownWaits);
  Error peerError(const transport::PeerNotice& notice) const;

  device::Device& device_;
  std::unique_ptr<transport::DeviceTransport> transport_;
  const int rank_;
  const int nranks_;
  const int deviceIndex_;
  const std::atomic<int64_t>& timeoutMs_;  // the communicator's, in force now
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs_.load(std::memory_order_relaxed));
  }
  const std::atomic<bool>& aborted_;
  const std::atomic<bool>& revoked_;  // this rank revoked the communicator (aborted_ is set too)
  OnFailure onFailure_;
  const size_t slotBytes_;
  const uint64_t slots_;

  // What ops are lowered onto: the ordinary FIFOs, or the graph FIFOs with
  // per-peer counters in device memory (this rank's messages sent to and
  // received from each peer by captured ops so far).
  struct Channel {
    transport::DeviceTransport* transport = nullptr;
    size_t slotBytes = 0;
    uint64_t slots = 0;
    uint32_t* sent = nullptr;
    uint32_t* received = nullptr;
    uint32_t* abort = nullptr;  // host memory; not 0: every wait of a replay passes (failed)
  };
  Channel main_;

  std::mutex mutex_;                                            // guards everything below
  std::unique_ptr<transport::DeviceTransport> graphTransport_;  // null until the first capture
  Channel graphs_;
  Channel* ch_ = &main_;  // lowering: the channel
  std::condition_variable changed_;
  std::deque<Op> ops_;  // outstanding, in issue order
  std::vector<device::EventHandle> freeEvents_;
  std::vector<device::FlagOp> pendingFlags_;      // lowering: the batch being built...
  device::StreamHandle pendingStream_ = nullptr;  // ...for this stream
  device::StreamHandle sends_ = nullptr;          // groups' sends (made on first use)
  Op* lowering_ = nullptr;                        // the op lowerPiece() adds to
  size_t releaseTurn_ = 0;                        // releaseWaits() calls, for its order
  std::vector<std::byte*> graphMemory_;           // captured ops' scratch areas, newest last
  size_t graphScratchBytes_ = 0;                  // the newest one's size
  size_t graphMemoryBytes_ = 0;                   // all of them, and the graph counters
  bool captured_ = false;                         // an op was captured: graph replays may run
  bool graphsReleased_ = false;                   // the abort word was written
  std::byte* scratch_ = nullptr;            // device memory shared by ops (they never overlap)
  std::vector<std::byte*> retiredScratch_;  // outgrown areas ops in flight may still use
  size_t retiredBytes_ = 0;                 // their sizes, summed
  int brokenTurns_ = 0;                     // watchdog turns in a row that a device call failed
  bool abandoned_ = false;  // ops were given up on a broken device: its memory is never freed
  size_t scratchBytes_ = 0;
  std::optional<Error> failure_;                // sticky
  int waitingFor_ = -1;                         // what this rank last told its peers it waits for
  std::vector<std::pair<int, bool>> departed_;  // peers that left otherwise: (rank, goodbye)
  std::vector<transport::PeerNotice> notices_;  // the watchdog's scratch
  bool stopping_ = false;
  std::thread watchdog_;  // last: starts once the rest is built
};

}  // namespace braid::exec
