// An algorithm selection for single calls, from outside braid's API (the
// NCCL layer's per-collective configs, ncclAllReduceConfig and the like):
// set on the calling thread around the call, read when the call's op is
// made.
#pragma once

#include <memory>

#include "tuning/algo_choice.h"

namespace braid::detail {

struct CallAlgorithm {
  // The algorithms the call may run (BRAID_ALGO's form); null: braid's choice.
  std::shared_ptr<const tuning::AlgoPreference> preference;
  // Whether a call none of them applies to fails (InvalidArgument) rather
  // than running braid's choice.
  bool force = true;
};

// The collectives this thread issues while a scope lives take its
// selection; scopes nest.
class CallAlgorithmScope {
 public:
  explicit CallAlgorithmScope(CallAlgorithm selection);
  ~CallAlgorithmScope();
  CallAlgorithmScope(const CallAlgorithmScope&) = delete;
  CallAlgorithmScope& operator=(const CallAlgorithmScope&) = delete;

 private:
  CallAlgorithm previous_;
};

}  // namespace braid::detail
