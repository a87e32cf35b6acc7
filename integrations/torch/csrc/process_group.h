// The torch.distributed backend "braid": a c10d backend whose collectives run
// on a braid communicator.
//
// Every call is checked and returns at once. Calls on CPU tensors are
// queued and run in issue order, one at a time: on the group's own
// thread, or inline in a thread that waits for one of them (Work::wait(),
// as a blocking dist.all_reduce does), which then runs the queue up to it,
// so a blocking call costs no hand-off between threads. Running a call
// means braid's blocking op, copying results back where a tensor had to be
// staged, and completing the torch Work and its future. So DDP's bucket
// all-reduces run while the backward pass goes on, and a future completes
// without anyone calling wait().
//
// Calls on CUDA tensors (where braid_torch is built with CUDA) take
// braid's device path on a communicator of their own, split off the
// group's on the first such call: their ops are enqueued at once, in the
// issuing thread, on torch's current CUDA stream, as ProcessGroupNCCL's
// are (cuda_work.h).
#pragma once

#include <torch/version.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "braid/communicator.h"

// Whether the torch built against is 2.`minor` or later (braid_torch
// builds against torch 2.4 and later).
#define BRAID_TORCH_SINCE(minor) (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= (minor))

// Backend's virtuals that torch added after 2.4: ProcessGroupBraid's
// overrides from the torch that declares them, its own methods (which
// torch does not call) before.
#if BRAID_TORCH_SINCE(7)  // supportsCoalescing, abort, shutdown: torch 2.7
#define BRAID_OVERRIDE_SINCE_2_7 override
#else
#define BRAID_OVERRIDE_SINCE_2_7
#endif
#if BRAID_TORCH_SINCE(9)  // getBackendOptions, setTimeout, split: torch 2.9
#define BRAID_OVERRIDE_SINCE_2_9 override
#else
#define BRAID_OVERRIDE_SINCE_2_9
#endif
#if BRAID_TORCH_SINCE(10)  // supportsShrinking, shrink: torch 2.10
#define BRAID_OVERRIDE_SINCE_2_10 override
#else
#define BRAID_OVERRIDE_SINCE_2_10
#endif
#if BRAID_TORCH_SINCE(14)  // gather_into_tensor: torch 2.14
#define BRAID_OVERRIDE_SINCE_2_14 override
#else
#define BRAID_OVERRIDE_SINCE_2_14
#endif

namespace braid::torch_backend {

class Calls;
struct CudaIssue;

// Fails a call for a bad argument (it reaches Python as a RuntimeError,
// naming the rank and the call); the group stays usable: nothing was issued.
[[noreturn]] void refuse(int rank, const char* call, const std::string& why);

// What a call runs: braid's op(s) on `comm` with `stream` (the default,
// host-synchronous stream for CPU tensors; torch's current CUDA stream
// for CUDA tensors). Returns the last op's Work: ops of one communicator
// finish in issue order, and a failure fails every later op.
using Op = std::function<braid::Work(braid::Communicator& comm, braid::Stream stream)>;
// Then, after the op: copies staged results back.
using Finish = std::function<void()>;

// The ops of `ops` as one braid group (so that sends and receives in any
// order cannot deadlock), returning the last one's Work.
Op grouped(std::vector<Op> ops);

// A torch Work, completed by whoever runs its call.
class BraidWork : public c10d::Work {
 public:
  BraidWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
            std::shared_ptr<Calls> calls);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;  // 0: none
  // Complete, with its outcome, as soon as its future is (which completes
  // first: see complete()).
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;

  bool done() const;
  // Marks the work and its future done; `error` empty means success.
  void complete(const std::string& error);

  // A receive's: the rank its data came from, which its op stores in
  // `source` before the Work completes (-1 until then).
  void reportSourceFrom(std::shared_ptr<const std::atomic<int>> source) {
    source_ = std::move(source);
  }
  int sourceRank() const override;

 private:
  std::shared_ptr<const std::atomic<int>> source_;
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<Calls> calls_;  // (a Work may outlive its group)
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A group's issued calls, run in issue order by one runner at a time.
//
// Who runs a call: while the group's calls are being waited for as they
// are issued (blocking dist.all_reduce), the group's thread leaves each
// call to its waiter for kGrace, so a blocking call runs in its caller's
// thread and the group's thread is not woken for it (on a busy host that
// wake-up preempts a rank in the middle of a collective). A call nobody
// claims within kGrace runs on the group's thread, and from then on calls
// go to the group's thread as they come (DDP's bucket all-reduces, futures
// with callbacks), until a waiter again finds its call already taken.
//
// Completing a call runs its future's callbacks, which may issue a later
// call and block on its future (PowerSGD's hook does). So a call's op runs
// under runMutex_ but its completion outside it, and while the group's
// thread is inside a completion, a call left waiting for kStall is taken by
// a helper thread (helper i while i of the group's threads are inside
// completions; each is started the first time it may be needed). Calls run
// in issue order; their futures complete in issue order unless a callback
// runs longer than kStall.
class Calls {
 public:
  using Clock = std::chrono::steady_clock;

  struct Call {
    c10::intrusive_ptr<BraidWork> work;
    Op run;         // braid's op(s), blocking on the group's communicator
    Finish finish;  // then: copy staged results back
    Clock::time_point queued{};
    // Works completed with `work`: those of the calls a coalesced batch holds.
    std::vector<c10::intrusive_ptr<BraidWork>> members;
    std::string error;  // once it ran: why it failed, or empty
  };

  explicit Calls(braid::Communicator& comm);  // starts the group's first thread
  ~Calls() { stop(); }
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;

  void push(Call call);
  // Runs queued calls until `work` is done (or nothing is queued).
  void runThrough(const BraidWork& work);
  // Runs what was issued to its end, then ends the group's threads.
  // Called by a thread outside the group.
  void stop();

 private:
  // How long a freshly issued call waits for its caller to claim it.
  static constexpr std::chrono::microseconds kGrace{50};
  // While calls were issued in the last kLinger, the group's thread looks
  // for unclaimed ones every kPoll instead of being woken for each.
  static constexpr std::chrono::microseconds kPoll{200};
  static constexpr std::chrono::milliseconds kLinger{5};
  // How long a call waits before a helper takes it.
  static constexpr std::chrono::microseconds kStall{200};

  // The group's first thread: runs calls as they come until stop() and
  // the queue is empty.
  void serve();
  // Helper `index` (1, 2, ...): runs calls while `index` of the group's
  // threads are completing calls, until stop().
  void help(int index);
  // Pops the next call and runs its op, with runMutex_ held; nullopt when
  // nothing is queued.
  std::optional<Call> runNext(bool ownThread);
  // Completes a call that ran (its future's callbacks run here), by one of
  // the group's threads: counted in completing_.
  void completeOnGroupThread(Call& call);
  // Runs the next call, if any, and completes it (queueMutex_ not held).
  void runOneOnGroupThread();
  static void complete(Call& call);

  braid::Communicator& comm_;        // the group's (outlives every call that runs)
  std::mutex runMutex_;              // held while a call's op runs: one at a time
  std::mutex queueMutex_;            // guards what follows
  std::condition_variable queued_;   // the first thread's
  std::condition_variable helpers_;  // the helpers'
  std::deque<Call> queue_;
  Clock::time_point lastPush_{};
  bool eager_ = false;     // the group's thread takes calls as they come
  bool sleeping_ = false;  // the group's thread waits to be woken
  bool stopping_ = false;
  bool exiting_ = false;              // the first thread has ended: helpers end too
  int completing_ = 0;                // the group's threads inside complete()
  std::vector<std::thread> threads_;  // [0] serve(), then help(1), help(2), ...
};

class ProcessGroupBraid : public c10d::Backend {
 public:
  // Meets the group's other ranks through `store`: rank 0 makes the job's
  // UniqueId and sets it there, the others read it. `timeout` becomes
  // braid's Config::timeout.
  ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);
  // A group on a communicator split off another's (split()); `store` is
  // the new group's.
  ProcessGroupBraid(braid::Communicator comm, c10::intrusive_ptr<c10d::Store> store,
                    c10::intrusive_ptr<Options> options);
  ~ProcessGroupBraid() override;

  const std::string getBackendName() const override { return "braid"; }
  // The name and timeout torch made the group with (its flight recorder
  // and split_group read them).
  c10::intrusive_ptr<Options> getBackendOptions() BRAID_OVERRIDE_SINCE_2_9 { return options_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  // gather_single: the inputs of every rank, in rank order, into one
  // tensor at the root (elsewhere `output` is not used).
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts)
      BRAID_OVERRIDE_SINCE_2_14;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  // From whichever rank's send arrives first (braid's recvFromAny); the
  // Work's sourceRank() then names it. CPU tensors, outside coalescing.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Gloo's debugging barrier, through the group's store rather than the
  // communicator, so that a rank that never comes costs only this call:
  // every rank checks in, and rank 0 names those that did not within the
  // timeout (opts.timeout, else the group's): the first of them, or all
  // with waitAllRanks. Not ordered with the group's queued calls.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // Coalescing (batch_isend_irecv, torch's _coalescing_manager, the
  // *_coalesced calls): the calls between startCoalescing() and
  // endCoalescing() run as one braid group, so sends and receives in any
  // order cannot deadlock; each call's Work completes with the batch's.
  bool supportsCoalescing() const BRAID_OVERRIDE_SINCE_2_7 { return true; }
  // The collectives issued on this group so far (point-to-point calls not
  // counted): the same on every rank that issued the same calls.
  uint64_t getSequenceNumberForGroup() override { return collectives_; }
  // dist.set_timeout: the group's timeout from now on, for braid's ops
  // (CPU and CUDA) and monitored_barrier's default.
  void setTimeout(std::chrono::milliseconds timeout) BRAID_OVERRIDE_SINCE_2_9;
  // Fails the call running and every queued one with braid's Aborted
  // (torch.distributed's _abort_process_group), and the ops enqueued on
  // CUDA streams, whose streams go on; the group is done.
  void abort() BRAID_OVERRIDE_SINCE_2_7;
  // Runs what was issued to its end (each call ends, or fails at braid's
  // timeout), then stops the group's thread.
  void shutdown() BRAID_OVERRIDE_SINCE_2_7;
  // split_group: every rank of this group calls it, each with the ranks of
  // its new group (a rank in none with a list that leaves it out, and gets
  // null back). It runs braid's split in turn with the calls issued before
  // it; the new group's timeout is the one `opts` gives. (Before torch 2.9,
  // which added Backend::split, torch splits only NCCL's groups, calling
  // methods of NCCL's: braid's then says it does not split.)
  bool supportsSplitting() const override { return BRAID_TORCH_SINCE(9); }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) BRAID_OVERRIDE_SINCE_2_9;
  // shrink_group: the ranks not in `ranksToExclude` call it (the others may
  // be dead, stopped or leaving) and get a group of themselves, ranked in
  // their old order, without the excluded ranks taking part (braid's
  // Communicator::shrink). With SHRINK_ABORT (1) the call running and the
  // queued ones fail first, so a group hung on a dead rank shrinks at once;
  // with SHRINK_DEFAULT (0) it runs after them. The new group's timeout is
  // the one `opts` gives, else this group's.
  bool supportsShrinking() const BRAID_OVERRIDE_SINCE_2_10 { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                           int shrinkFlags, const c10::intrusive_ptr<Options>& opts)
      BRAID_OVERRIDE_SINCE_2_10;
  // Every rank of this group and `size` - size() new processes make a group
  // of `size` ranks, in which this group's keep their ranks and the new
  // ones take the ranks after (braid's Communicator::grow). They meet
  // through `store`: this group's rank 0 sets the id there, and the new
  // processes read it (joinGrown). No torch call asks for it; torchft's
  // reconfiguration does (braid_torch.torchft).
  c10::intrusive_ptr<c10d::Backend> grow(const c10::intrusive_ptr<c10d::Store>& store, int size);
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

 private:
  // Issues a call whose tensors are on `device` (its arguments checked
  // already, captured by value in `run` and `finish`): CPU calls are
  // queued (run on comm_, blocking), CUDA calls go to postOnCuda.
  c10::intrusive_ptr<c10d::Work> post(c10::Device device, c10d::OpType type,
                                      std::vector<at::Tensor> outputs, Op run, Finish finish = {});
  // Enqueues the call on torch's current stream of `device`, on
  // cudaComm(); while coalescing, adds it to cudaBatch_ (cuda_work.cc).
  c10::intrusive_ptr<c10d::Work> postOnCuda(c10::Device device, c10d::OpType type,
                                            std::vector<at::Tensor> outputs, Op run, Finish finish);
  // endCoalescing for a batch of calls on CUDA tensors: enqueues them as one.
  c10::intrusive_ptr<c10d::Work> endCudaCoalescing();
  // The Work of a coalesced call issued inside a CUDA batch: the batch's
  // outputs from `firstOutput` on are its own.
  c10::intrusive_ptr<c10d::Work> cudaMember(c10d::OpType type, size_t firstOutput);
  // The communicator for calls on CUDA tensors: split off comm_ (with
  // `device` current) by the first such call, in turn with the calls
  // issued before it. Every later call must be on the same device.
  braid::Communicator& cudaComm(c10::Device device);
  // Issues the calls `issue` makes as one coalesced batch (inside a batch
  // the caller opened already: as part of it) and returns its Work.
  c10::intrusive_ptr<c10d::Work> coalesced(c10d::OpType type, const std::function<void()>& issue);

  // While coalescing: the calls issued so far, not yet queued (CPU) or
  // enqueued (CUDA: cudaBatch_). Touched only by the issuing thread.
  bool coalescing_ = false;
  uint64_t collectives_ = 0;  // issued (getSequenceNumberForGroup)
  uint64_t issued_ = 0;       // calls issued, of every kind
  struct LastSplit {
    std::vector<int> ranks;
    uint64_t issued;                                              // issued_ then
    std::optional<c10::weak_intrusive_ptr<c10d::Backend>> child;  // none: in no new group
  };
  std::optional<LastSplit> lastSplit_;  // split()'s last
  uint64_t monitoredBarriers_ = 0;      // run (their store keys)
  bool shutDown_ = false;               // shutdown() ran: no more calls
  std::vector<Calls::Call> batch_;

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  braid::Communicator comm_;
  std::shared_ptr<Calls> calls_;

  // Calls on CUDA tensors (cuda_work.h).
  struct CudaBatch {
    std::shared_ptr<CudaIssue> issue;
    c10::Device device;
    std::vector<Op> runs;
    std::vector<Finish> finishes;
    std::vector<at::Tensor> outputs;
  };
  std::optional<CudaBatch> cudaBatch_;  // while coalescing calls on CUDA tensors
  // Enqueued calls not yet seen finished, with the tensors they use, which
  // stay alive until then (released as later calls are issued).
  std::deque<std::shared_ptr<CudaIssue>> inFlight_;
  // (Destroyed before inFlight_: it first finishes what was enqueued.)
  std::optional<braid::Communicator> cudaComm_;
};

// The creator torch.distributed calls (Backend.register_backend).
c10::intrusive_ptr<c10d::Backend> createProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int size,
                                                     std::chrono::milliseconds timeout);

// A new process's side of ProcessGroupBraid::grow(): rank `rank` of the
// grown group of `size`, met through the members' `store`.
c10::intrusive_ptr<c10d::Backend> joinGrown(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, std::chrono::milliseconds timeout);

}  // namespace braid::torch_backend
