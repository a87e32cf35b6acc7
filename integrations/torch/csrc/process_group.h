// The torch.distributed backend "braid": a c10d process group (torch 1.x) or
// backend (torch 2.x) whose collectives run on a braid communicator.
//
// Every call is issued on braid's progress thread (Stream::async()) and
// returns at once; one completion thread per group waits for braid's ops in
// issue order, copies results back where a tensor had to be staged, and
// completes the torch Work and its future. So DDP's bucket all-reduces run
// while the backward pass goes on, and a future completes without anyone
// calling wait().
#pragma once

#include <torch/version.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "braid/communicator.h"

namespace braid::torch_backend {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;  // torch 2 wraps a backend in its ProcessGroup
#else
using BackendBase = c10d::ProcessGroup;
#endif

// A torch Work completed by the group's completion thread.
class BraidWork : public c10d::Work {
 public:
  BraidWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;

  // Marks the work and its future done; `error` empty means success.
  void complete(const std::string& error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupBraid : public BackendBase {
 public:
  // Meets the group's other ranks through `store`: rank 0 makes the job's
  // UniqueId and sets it there, the others read it. `timeout` becomes
  // braid's Config::timeout.
  ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);
  ~ProcessGroupBraid() override;

  const std::string getBackendName() const override { return "braid"; }

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
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  // One issued call: braid's ops for it, what to do once they all
  // finished (copy staged results back), and the torch Work to complete.
  struct Pending {
    std::vector<braid::Work> works;
    std::function<void()> finish;
    c10::intrusive_ptr<BraidWork> work;
  };

  // Issues `ops` (which call the communicator with Stream::async()) under
  // the issue lock and hands the result to the completion thread.
  c10::intrusive_ptr<c10d::Work> post(c10d::OpType type, std::vector<at::Tensor> outputs,
                                      const std::function<void(std::vector<braid::Work>&)>& ops,
                                      std::function<void()> finish = {});
  void completeInOrder();

  braid::Communicator comm_;
  std::mutex issueMutex_;  // callers of one group may be several threads

  std::mutex queueMutex_;
  std::condition_variable queued_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::thread completer_;
};

// The creator torch.distributed calls (Backend.register_backend).
c10::intrusive_ptr<BackendBase> createProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size,
                                                   std::chrono::milliseconds timeout);

}  // namespace braid::torch_backend
