// The communicator's state. Only src/core sees it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "braid/communicator.h"
#include "core/knobs.h"
#include "core/plan_cache.h"
#include "device/device.h"
#include "exec/cpu_executor.h"
#include "exec/device_executor.h"
#include "transports/wiring.h"
#include "tuning/copy_choice.h"

namespace braid {

class DeviceSignals;
class OneSided;

// The deadline `timeout` from now: of a communicator's set-up, or of one
// agreement among its ranks.
inline net::Deadline deadlineAfter(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + timeout;
}

struct Work::State {
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  bool inOpenGroup = false;  // issued inside a group that has not ended yet
  bool captured = false;     // captured into a graph: it runs on each replay
  // The failure, as plain values: wait() throws an Error of its own, so
  // no exception object is shared by the thread that completes an op and
  // the threads that wait for it.
  std::optional<ErrorCode> errorCode;
  std::string errorMessage;

  void complete(const Error* failure);
};

// One issued operation, bound to its buffers, waiting to run.
struct PendingOp {
  exec::OpInfo info;
  // The plan; inside a group it is looked up when the group ends (a first
  // call may time algorithms then, with the other ranks: see resolvePlan).
  const algo::Plan* plan = nullptr;
  std::shared_ptr<const algo::Plan> keepPlan;  // set for ops that run after issue() returns
  // What the op is: a collective, or Send or Recv (point-to-point).
  Collective kind = Collective::AllReduce;
  algo::Shape shape;
  const void* input = nullptr;
  void* output = nullptr;
  uint32_t tag = 0;  // set by issue()
  bool async = false;
  // Its buffers are device memory: it is enqueued on `deviceStream` (a
  // cudaStream_t, or the emulated device's stream).
  bool onDevice = false;
  void* deviceStream = nullptr;
  // In windows (shape.mapped): every rank's input and output as this rank
  // reaches them.
  std::vector<const std::byte*> peerInputs;
  std::vector<std::byte*> peerOutputs;
  std::shared_ptr<Work::State> work;
  // The call's own algorithm selection (detail::CallAlgorithmScope), if any.
  std::shared_ptr<const tuning::AlgoPreference> preference;
  bool forcePreference = false;
  // One of the tuner's timed calls (timeContenders): it takes its size's
  // copy path and does not count towards the choice of it (CopyChoice).
  bool tunerTrial = false;

  bool pointToPoint() const { return kind == Collective::Send || kind == Collective::Recv; }
};

// A window this rank registered: its memory, and every rank's as this
// rank reaches it. Unmaps what it imported when it goes.
class RegisteredWindow {
 public:
  RegisteredWindow(uint64_t id, std::byte* base, size_t bytes,
                   std::vector<transport::PeerWindow> ranks, device::Device& device)
      : id_(id), base_(base), bytes_(bytes), ranks_(std::move(ranks)), device_(&device) {}
  RegisteredWindow(RegisteredWindow&& other) noexcept { *this = std::move(other); }
  RegisteredWindow& operator=(RegisteredWindow&& other) noexcept;
  ~RegisteredWindow();

  uint64_t id() const { return id_; }
  std::byte* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // Where rank `r` has [pointer, pointer + bytes) of this rank's window,
  // or null when the range is not in the window or `r` does not map it
  // (another host, or a peer staged over tcp).
  std::byte* at(int r, const void* pointer, size_t bytes) const;
  bool reachesEveryRank() const;

 private:
  uint64_t id_ = 0;
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<transport::PeerWindow> ranks_;
  device::Device* device_ = nullptr;
};

struct Communicator::Impl {
  // The link model a communicator measured (BRAID_TUNING=measured), for
  // one made from it among some of its ranks: `rows` says over which
  // transports it was measured.
  struct MeasuredLink {
    uint32_t rows = 0;
    algo::LinkModel link;
    size_t addressFrom = 0;  // pieces by address from this size (0: none), if it measured that
  };
  // A communicator shrunk from `parent`, whose rank ranks[r] is rank r of
  // this one, takes over the parent's link model, where every pair talks
  // over the kinds of transport it was measured over, and what its
  // transports can of the parent's connections (transport::Parent).
  struct Lineage {
    const Impl& parent;
    std::vector<int> ranks;
  };
  Impl(std::unique_ptr<bootstrap::Bootstrap> bootstrap, const Knobs& knobs,
       const Lineage* lineage = nullptr);
  ~Impl();

  // Looks up the plan of `op` (and keeps it when `keep`). With measured
  // tuning the first call of a size class times its contenders right here,
  // running collectives with the other ranks: so an op issued inside a group
  // is looked up when the group ends, where one thread may end the groups of
  // several communicators at once, each on its own thread.
  void resolvePlan(PendingOp& op, bool keep);
  // BRAID_DEBUG_COLLECTIVES: every rank's fingerprint of collective `op`
  // (sequence number, collective, type, count, op, root) to every rank, by a
  // small all-gather run now; InvalidUsage on every rank naming the ranks
  // that called something else, and what each called. Not sticky: nothing
  // of the op has moved.
  void verifySameCollective(const PendingOp& op);
  // Issues `op`: into the open group, onto the progress thread, or inline.
  Work issue(PendingOp&& op);
  // Device collectives in windows: sets op.shape.mapped and every rank's
  // view of the op's buffers when they are (all of them, on every rank).
  void mapBuffers(PendingOp& op) const;
  // Enqueues device ops together on their streams; their Work completes
  // once the device passed them. Throws (completing their Work with the
  // error) when they cannot be enqueued.
  void executeOnDevice(PendingOp* ops, size_t count);
  // Whether `ops` are being captured into a graph (their stream is).
  // Throws InvalidUsage for a group on several streams, or a communicator
  // without graph FIFOs (noGraphs says why).
  bool captureDevice(const PendingOp* ops, size_t count,
                     const std::vector<device::StreamHandle>& streams);
  // Collective: gives the communicator its device and device connections
  // when every rank has a device; else notes why not (noDevice).
  void setUpDevice(const Lineage* lineage);
  // What device connections and window mappings are made with: the device
  // FIFOs' shape, and the timeout from now as the deadline.
  transport::Setup deviceSetup() const;
  // Runs ops together in the calling thread and completes their Work.
  // REQUIRES: the calling thread owns the executor. The progress thread owns
  // it while `outstanding` > 0; the user's thread (one at a time, as for
  // every call but abort()) once waitForAsyncIdle() returned, since only it
  // can queue more.
  void execute(PendingOp* ops, size_t count);
  // After the executor threw while running ops: `error` becomes the sticky
  // failure and every peer is told whom this rank blames.
  void failedToRun(const Error& error);
  // A receive of `count` elements of `type` from any source: waits in the
  // calling thread (after the progress thread went idle) until some peer's
  // next send to this rank has arrived, and returns that peer; the
  // receive from it is then issued as any other. Fails as execute() does.
  int awaitSender(size_t count, DataType type);
  // Sets what each lane's pieces may be lent from: whether its input is
  // settled (no op of the group writes it), and its memAlloc regions.
  void findRegions(const PendingOp* ops, exec::Lane* lanes, size_t count) const;
  // BRAID_TUNING=measured: runs each contender a few times on zeroed
  // buffers shaped like the call, agrees with the other ranks on the
  // slowest rank's time of each, and returns the fastest. Every rank calls
  // it at the same op, so the trials' sequence numbers stay aligned.
  algo::Algorithm timeContenders(Collective collective, const algo::Shape& shape,
                                 const std::vector<algo::Algorithm>& contenders);
  // Waits until the progress thread has nothing queued or running.
  void waitForAsyncIdle();
  void enqueue(std::vector<PendingOp> ops);
  void progressLoop();

  // Throws the sticky failure, if any (every later op fails fast with it).
  void throwIfFailed() const;
  // Makes `error` the sticky failure unless there is one; `blamed` and
  // `reason`, where known, say whom giveUp() names and why.
  void recordFailure(const Error& error, int blamed = -1,
                     transport::GiveUpReason reason = transport::GiveUpReason::Failed);
  // After a failed op: every peer is told this rank is out because of rank
  // `blamed` (-1: unknown), once, so that each fails at once and names it.
  void giveUp(int blamed);
  // The peers were told (giveUp()); by the thread that runs ops, or by
  // revoke() from another while none runs.
  std::atomic<bool> gaveUp{false};
  // shrink(): the rendezvous among the ranks that `known` does not leave
  // out (per rank: expected, excluded, seen failing or gone; shrink.cc;
  // with `agreed`, what this rank saw fail, found here), which agree on the
  // members (`agreed`: the ranks that failed are found out; else exactly
  // the ranks not excluded), then the new communicator's own set-up. The
  // ops pending here finish first, or fail at once (`abortPending`, which
  // leaves this communicator aborted). Throws as Communicator::shrink says.
  std::unique_ptr<Impl> shrinkTo(std::vector<uint8_t> known, bool agreed, bool abortPending);
  // Completes the Work of every op of the open group with `error` and
  // forgets them.
  void dropGroup(const Error& error);
  // Communicator::revoke(): the sticky Revoked failure, and the peers told
  // (here when no thread is running ops, else by the op that fails).
  void revoke();

  const int rank;
  const int nranks;
  const Knobs knobs;
  std::unique_ptr<bootstrap::Bootstrap> bootstrap;
  transport::Wiring wiring;
  std::unique_ptr<exec::Executor> executor;
  PlanCache plans{knobs.oneShotBytes, tuning::AlgoPreference::parse(knobs.algo)};
  std::optional<MeasuredLink> measuredLink;  // set when this communicator measured its links
  // With BRAID_CMA_BYTES=auto on shared memory, once calibration guessed
  // where pieces go by address: large ops choose how their pieces cross as
  // they run (execute()).
  std::optional<tuning::CopyChoice> copyChoice;
  // Per DataType: this communicator's plan shape, all but the count.
  std::array<algo::Shape, kNumDataTypes> shapes;

  // The timeout of ops issued from now on: Config::timeout, or what
  // setTimeout() made it since (milliseconds; the device executor's
  // watchdog reads it too).
  std::atomic<int64_t> timeoutMs;
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs.load(std::memory_order_relaxed));
  }

  std::atomic<bool> aborted{false};
  // suspend(): every op is refused until resume() makes `suspendedScratch`
  // bytes of device scratch again.
  std::atomic<bool> suspended{false};
  size_t suspendedScratch = 0;
  std::atomic<bool> revoked{false};  // by this rank: aborted says so too
  // A thread runs ops in the executor (execute(), awaitSender()): revoke()
  // from another thread leaves telling the peers to it.
  std::atomic<bool> running{false};
  std::atomic<bool> failed{false};  // failure is set: lets the hot path skip the mutex
  mutable std::mutex failureMutex;
  std::optional<Error> failure;  // the first sticky error
  int failureBlames = -1;        // ...and whom it blamed, why
  transport::GiveUpReason failureReason = transport::GiveUpReason::Failed;

  // Collectives issued, the same on every rank; and collectives completed
  // here (the sequence number after the last). Written by the threads that
  // issue and run ops, read by hang reports from any thread.
  std::atomic<uint64_t> collectiveSeq{0};
  std::atomic<uint64_t> completedSeq{0};
  uint64_t nextCollectiveSeq() {  // a plain increment: only the issuing thread writes it
    const uint64_t seq = collectiveSeq.load(std::memory_order_relaxed);
    collectiveSeq.store(seq + 1, std::memory_order_relaxed);
    return seq;
  }
  // One line on what this communicator is doing, for hang reports.
  std::string describeState() const;
  std::vector<uint64_t> sendSeq;   // sends issued to each peer
  std::vector<uint64_t> recvSeq;   // receives issued from each peer
  uint64_t anySourceReceives = 0;  // recvFromAny calls matched so far
  int nextAnySource = 0;           // the peer recvFromAny looks at first
  uint64_t splits = 0;             // split() calls, for the child's secret
  uint64_t shrinks = 0;            // shrink() calls, for their rendezvous
  int groupDepth = 0;
  std::vector<PendingOp> group;         // ops issued inside the open group
  std::byte barrierIn{}, barrierOut{};  // the barrier's 1-byte all-reduce

  // Device memory. `device` is the process's device (null: none), and
  // deviceExecutor exists when every rank has one; otherwise noDevice says
  // why device buffers cannot be used.
  device::Device* device = nullptr;
  int deviceIndex = -1;
  std::vector<uint8_t> deviceReady;  // by rank: whether it has a device to use
  std::string noDevice;
  std::string noGraphs;  // why device ops cannot be captured into graphs ("" when they can)
  std::array<algo::Shape, kNumDataTypes> deviceShapes;  // chunks of half a device FIFO
  PlanCache devicePlans{knobs.oneShotBytes, tuning::AlgoPreference::parse(knobs.algo)};
  // Registered windows (destroyed after the device executor, which waits
  // for every op that may use them).
  std::vector<RegisteredWindow> windows;
  uint64_t nextWindow = 1;
  // Host windows and one-sided calls; made by the first host window.
  std::unique_ptr<OneSided> oneSided;
  // Device windows' one-sided calls; made by the first device window.
  std::unique_ptr<DeviceSignals> deviceSignals;

  std::mutex queueMutex;  // guards queue, outstanding, stopping
  std::condition_variable queueChanged;
  std::deque<std::vector<PendingOp>> queue;
  std::atomic<size_t> outstanding{0};  // queued or running on the progress thread
  bool stopping = false;
  std::thread progressThread;  // started by the first async op

  // Last: its watchdog reports failures into the members above.
  std::unique_ptr<exec::DeviceExecutor> deviceExecutor;
};

}  // namespace braid
