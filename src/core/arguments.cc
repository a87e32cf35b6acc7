#include "core/arguments.h"

#include <cstdio>
#include <vector>

namespace braid {

Communicator::Impl& usable(Communicator::Impl* impl, const char* op) {
  if (!impl)
    throw Error(ErrorCode::InvalidUsage,
                format("braid: %s on an empty communicator handle (moved from, or split with a "
                       "negative color)",
                       op));
  impl->throwIfFailed();
  if (impl->suspended.load(std::memory_order_relaxed))
    fail(ErrorCode::InvalidUsage, impl->rank,
         format("%s: the communicator is suspended (suspend()): resume() it first", op));
  return *impl;
}

void agreeOnArguments(Communicator::Impl& impl, const char* call, const std::string& problem) {
  struct Verdict {
    char what[240];  // "" when fine
  };
  std::vector<Verdict> all(static_cast<size_t>(impl.nranks));
  std::snprintf(all[impl.rank].what, sizeof(Verdict::what), "%s", problem.c_str());
  impl.bootstrap->allGather(all.data(), sizeof(Verdict), deadlineAfter(impl.knobs.timeout));
  for (int r = 0; r < impl.nranks; ++r) {
    Verdict& verdict = all[r];
    verdict.what[sizeof(verdict.what) - 1] = '\0';
    if (verdict.what[0] == '\0') continue;
    if (r == impl.rank)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid rank %d: %s: %s", impl.rank, call, verdict.what));
    throw Error(ErrorCode::InvalidArgument, format("braid rank %d: %s: rank %d's call is wrong: %s",
                                                   impl.rank, call, r, verdict.what));
  }
}

}  // namespace braid
