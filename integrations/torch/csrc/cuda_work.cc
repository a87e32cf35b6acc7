#include "cuda_work.h"

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>

#include "braid/error.h"

namespace braid::torch_backend {

// ---------------------------------------------------------------- CudaIssue

void CudaIssue::enqueue(Communicator& comm, Op ops, Finish copies) {
  run = std::move(ops);
  finish = std::move(copies);
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  try {
    last = run(comm, Stream::cuda(current.stream()));
    if (finish) finish();  // torch's copies, queued on `current` after braid's ops
  } catch (...) {
    refused = std::current_exception();
    enqueued = true;
    for (auto& [future, value] : futures) future->setError(refused);
    throw;
  }
  // (`current` is the current stream here.)
  captured = c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::Active;
  done.record(current);
  enqueued = true;
  // A CUDA future completes with the events of its devices' current
  // streams: these are the ops' stream's.
  const c10::cuda::CUDAStreamGuard onStream(current);
  for (auto& [future, value] : futures) future->markCompleted(value);
  futures.clear();  // (the Works keep their futures)
}

bool CudaIssue::finished() const {
  if (!enqueued) return false;
  if (refused || captured) return true;  // (a captured op runs on each replay)
  return last.test() && done.query();
}

std::exception_ptr CudaIssue::failure() const {
  if (refused) return refused;
  if (!enqueued || captured || !last.test()) return nullptr;
  try {
    last.wait();  // finished: returns at once, or rethrows braid's error
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// ---------------------------------------------------------------- CudaWork

CudaWork::CudaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                   std::shared_ptr<CudaIssue> issue)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      issue_(std::move(issue)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                       std::vector<c10::Device>{issue_->device})) {
  issue_->futures.emplace_back(future_, c10::IValue(outputs_));
}

void CudaWork::requireEnqueued(const char* what) const {
  if (!issue_->enqueued)
    throw Error(ErrorCode::InvalidUsage, "braid rank " + std::to_string(rank_) + ": " + what +
                                             " on a call of a coalesced batch before "
                                             "endCoalescing");
}

bool CudaWork::isCompleted() { return issue_->finished(); }

std::exception_ptr CudaWork::exception() const { return issue_->failure(); }

void CudaWork::synchronize() {
  requireEnqueued("synchronize()");
  if (issue_->refused) return;
  issue_->done.block(c10::cuda::getCurrentCUDAStream(issue_->device.index()));
}

bool CudaWork::wait(std::chrono::milliseconds /*timeout: braid's, the group's*/) {
  requireEnqueued("wait()");
  synchronize();
  if (const std::exception_ptr failed = exception()) std::rethrow_exception(failed);
  return true;
}

// ---------------------------------------------------------------- the group

Communicator& ProcessGroupBraid::cudaComm(c10::Device device) {
  if (cudaComm_) {
    if (cudaComm_->device() != device.index())
      refuse(rank_, "a call on CUDA tensors",
             "its tensors are on " + device.str() +
                 ", and this group's earlier CUDA calls on cuda:" +
                 std::to_string(cudaComm_->device()) +
                 ": a group's CUDA tensors are on one device per process");
    return *cudaComm_;
  }
  // In turn with the calls issued before it, on every rank: the first
  // call on CUDA tensors is the same call everywhere.
  auto child = std::make_shared<std::optional<Communicator>>();
  const int index = device.index();
  auto work = c10::make_intrusive<BraidWork>(rank_, c10d::OpType::UNKNOWN,
                                             std::vector<at::Tensor>{}, calls_);
  calls_->push({work,
                [child, index, rank = rank_](Communicator& comm, Stream) {
                  // (braid takes the calling thread's current device)
                  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
                  child->emplace(comm.split(0, rank));
                  return Work();
                },
                {},
                {},
                {},
                {}});
  work->wait();
  if ((*child)->device() != index)
    refuse(rank_, "a call on CUDA tensors",
           "braid has no device path here (it was built without CUDA, or BRAID_DEVICE turns it "
           "off), so it cannot take tensors on " +
               device.str());
  cudaComm_ = std::move(**child);
  return *cudaComm_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::postOnCuda(c10::Device device, c10d::OpType type,
                                                             std::vector<at::Tensor> outputs,
                                                             Op run, Finish finish) {
  Communicator& comm = cudaComm(device);
  if (coalescing_) {
    if (!cudaBatch_)
      cudaBatch_ = CudaBatch{std::make_shared<CudaIssue>(device), device, {}, {}, {}};
    cudaBatch_->runs.push_back(std::move(run));
    if (finish) cudaBatch_->finishes.push_back(std::move(finish));
    cudaBatch_->outputs.insert(cudaBatch_->outputs.end(), outputs.begin(), outputs.end());
    return c10::make_intrusive<CudaWork>(rank_, type, std::move(outputs), cudaBatch_->issue);
  }
  // The tensors of calls the device finished are released here.
  std::erase_if(inFlight_,
                [](const std::shared_ptr<CudaIssue>& issue) { return issue->finished(); });
  auto issue = std::make_shared<CudaIssue>(device);
  auto work = c10::make_intrusive<CudaWork>(rank_, type, std::move(outputs), issue);
  issue->enqueue(comm, std::move(run), std::move(finish));
  inFlight_.push_back(std::move(issue));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::cudaMember(c10d::OpType type,
                                                             size_t firstOutput) {
  std::vector<at::Tensor> outputs(cudaBatch_->outputs.begin() + static_cast<ptrdiff_t>(firstOutput),
                                  cudaBatch_->outputs.end());
  return c10::make_intrusive<CudaWork>(rank_, type, std::move(outputs), cudaBatch_->issue);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::endCudaCoalescing() {
  CudaBatch batch = std::move(*cudaBatch_);
  cudaBatch_.reset();
  auto work = c10::make_intrusive<CudaWork>(rank_, c10d::OpType::COALESCED,
                                            std::move(batch.outputs), batch.issue);
  std::erase_if(inFlight_,
                [](const std::shared_ptr<CudaIssue>& issue) { return issue->finished(); });
  batch.issue->enqueue(*cudaComm_, grouped(std::move(batch.runs)),
                       [finishes = std::move(batch.finishes)] {
                         for (const Finish& finish : finishes) finish();
                       });
  inFlight_.push_back(std::move(batch.issue));
  return work;
}

}  // namespace braid::torch_backend
