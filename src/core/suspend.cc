// Suspending a communicator's device memory, and counting it
// (Communicator::suspend, resume and memoryStats; NCCL's ncclCommSuspend,
// ncclCommResume and ncclCommMemStats).
#include "core/arguments.h"
#include "core/communicator_impl.h"
#include "core/device_one_sided.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid {

Communicator::MemoryStats Communicator::memoryStats() const {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: memoryStats() on an empty communicator handle");
  MemoryStats stats;
  stats.suspended = impl_->suspended.load();
  if (impl_->deviceExecutor) {
    const exec::DeviceExecutor::Memory memory = impl_->deviceExecutor->memory();
    stats.suspendable = memory.releasable;
    stats.persistent = memory.persistent;
  }
  // The device windows' signal board (the windows are the caller's memory).
  if (impl_->deviceSignals) stats.persistent += impl_->deviceSignals->boardBytes();
  return stats;
}

void Communicator::suspend() {
  Impl& impl = usable(impl_.get(), "suspend");
  impl.waitForAsyncIdle();
  if (impl.groupDepth > 0)
    fail(ErrorCode::InvalidUsage, impl.rank,
         "suspend: a group is open (end it with groupEnd() first)");
  // The agreement is also the barrier behind every rank's ops.
  if (impl.deviceExecutor) impl.deviceExecutor->waitIdle();
  agreeOnArguments(impl, "suspend", "");
  impl.suspendedScratch = impl.deviceExecutor ? impl.deviceExecutor->releaseScratch() : 0;
  impl.suspended = true;
  BRAID_INFO(Init, "rank %d: suspended, %zu bytes of device scratch freed", impl.rank,
             impl.suspendedScratch);
}

void Communicator::resume() {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: resume() on an empty communicator handle");
  Impl& impl = *impl_;
  impl.throwIfFailed();
  agreeOnArguments(impl, "resume",
                   impl.suspended ? "" : "the communicator is not suspended (suspend())");
  if (impl.deviceExecutor && impl.suspendedScratch > 0) {
    try {
      impl.deviceExecutor->restoreScratch(impl.suspendedScratch);
    } catch (const Error& error) {  // still suspended: a later resume() may find the memory
      fail(error.code(), impl.rank,
           format("resume: making %zu bytes of device scratch again: %s", impl.suspendedScratch,
                  error.what()));
    }
  }
  impl.suspendedScratch = 0;
  impl.suspended = false;
}

}  // namespace braid
