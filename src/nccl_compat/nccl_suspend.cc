// The C API's suspending calls (NCCL 2.29): ncclCommSuspend,
// ncclCommResume and ncclCommMemStats, over Communicator::suspend, resume
// and memoryStats.
#include "nccl_compat/nccl_internal.h"

using namespace braid::nccl;

namespace {

// Runs the collective `call` now, or at ncclGroupEnd inside a group (one
// thread suspending several ranks of its own: each takes part at once).
ncclResult_t collective(std::function<void()> call) {
  Group& group = openGroup();
  if (group.depth > 0)
    group.creations.push_back(std::move(call));
  else
    call();
  return ncclSuccess;
}

}  // namespace

extern "C" {

NCCL_EXPORT ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags) {
  const char* fn = "ncclCommSuspend";
  return guarded(fn, [&] {
    InCall call(comm);
    usable(comm, fn, false);
    if ((flags & ~NCCL_SUSPEND_MEM) != 0)
      return badArgument(fn, format("argument 'flags' is 0x%x: bits 0x%x are no NCCL_SUSPEND_ flag",
                                    flags, flags & ~NCCL_SUSPEND_MEM));
    if (!(flags & NCCL_SUSPEND_MEM)) return ncclSuccess;  // nothing else can be suspended
    return collective([comm, fn] { usable(comm, fn, false).comm.suspend(); });
  });
}

NCCL_EXPORT ncclResult_t pncclCommResume(ncclComm_t comm) {
  const char* fn = "ncclCommResume";
  return guarded(fn, [&] {
    InCall call(comm);
    usable(comm, fn, false);
    // Every rank suspended together, or none did: then there is nothing
    // to resume, on any rank.
    return collective([comm, fn] {
      Communicator& c = usable(comm, fn, false).comm;
      if (c.memoryStats().suspended) c.resume();
    });
  });
}

NCCL_EXPORT ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat,
                                           uint64_t* value) {
  const char* fn = "ncclCommMemStats";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn, false);
    if (!value) return badArgument(fn, "argument 'value' is NULL");
    const Communicator::MemoryStats stats = c.comm.memoryStats();
    const int raw = rawValue(stat);  // (any int may come from C: never load it as the enum)
    switch (raw) {
      case ncclStatGpuMemSuspend:
        *value = stats.suspendable;
        return ncclSuccess;
      case ncclStatGpuMemSuspended:
        *value = stats.suspended ? 1 : 0;
        return ncclSuccess;
      case ncclStatGpuMemPersist:
        *value = stats.persistent;
        return ncclSuccess;
      case ncclStatGpuMemTotal:
        *value = stats.total();
        return ncclSuccess;
    }
    return badArgument(fn, format("argument 'stat' is %d, not an ncclCommMemStat_t", raw));
  });
}

}  // extern "C"

NCCL_ALIAS(ncclResult_t, CommSuspend, (ncclComm_t comm, int flags));
NCCL_ALIAS(ncclResult_t, CommResume, (ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, CommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value));
