// Calls on CUDA tensors, run the way ProcessGroupNCCL runs them: a call's
// ops are enqueued at once, in the issuing thread, on torch's current CUDA
// stream of the tensors' device, through braid's device path
// (braid::Stream::cuda). They run after the work queued on that stream
// before the call and before what is queued after it; the call returns
// without waiting for them, and Work::wait() makes the caller's current
// stream wait, never the CPU.
#pragma once

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "process_group.h"

namespace braid::torch_backend {

// Ops on CUDA tensors enqueued together (one call, or a coalesced batch),
// shared by the Works of the calls they carry out.
struct CudaIssue {
  explicit CudaIssue(c10::Device device) : device(device) {}

  // Enqueues `run` and then `finish` (torch's copies of staged results) on
  // the current stream of `device` with it current, records `done` after
  // them and completes the futures. A failure to enqueue fails the
  // futures and is rethrown.
  void enqueue(Communicator& comm, Op run, Finish finish);
  // Enqueued, and the device is past the ops and copies (or they failed).
  bool finished() const;
  // The ops' failure, once braid reported one (a peer failed, abort()).
  std::exception_ptr failure() const;

  const c10::Device device;
  bool enqueued = false;
  bool captured = false;  // the stream was being captured into a CUDA graph
  std::exception_ptr refused;
  Work last;  // the last op's (see Op)
  at::cuda::CUDAEvent done;
  // The Works' futures, and what each completes with (until enqueued).
  std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Future>, c10::IValue>> futures;
  // The closures hold every tensor the ops and copies use; the group drops
  // them once finished() (ProcessGroupBraid::inFlight_).
  Op run;
  Finish finish;
};

// The Work of a call on CUDA tensors.
class CudaWork : public c10d::Work {
 public:
  CudaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
           std::shared_ptr<CudaIssue> issue);

  // Whether the device finished the ops; never blocks.
  bool isCompleted() override;
  bool isSuccess() const override { return !exception(); }
  std::exception_ptr exception() const override;
  // The caller's current stream waits for the ops.
  void synchronize() override;
  // synchronize(), then rethrows a failure braid already reported; the CPU
  // does not wait for the device (as ProcessGroupNCCL's default).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // Complete once the ops are enqueued, holding the stream's event: what
  // waits on it, or runs in its callbacks, runs after the ops.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  // Fails use before endCoalescing enqueued the batch.
  void requireEnqueued(const char* what) const;

  std::vector<at::Tensor> outputs_;
  std::shared_ptr<CudaIssue> issue_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace braid::torch_backend
