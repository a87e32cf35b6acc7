// Chunk arithmetic shared by the ring planners.
#pragma once

#include <algorithm>
#include <cstddef>

#include "algorithms/plan.h"

namespace braid::algo {

inline int ringIndex(long long i, int n) { return static_cast<int>(((i % n) + n) % n); }

// One round of a ring collective covers `length` elements split into n
// chunks of equal, aligned size; the last chunks may be short or empty.
struct RingRound {
  size_t base;
  size_t length;
  size_t chunk;

  RingRound(size_t base, size_t length, int n, size_t align) : base(base), length(length) {
    size_t even = (length + n - 1) / n;
    chunk = (even + align - 1) / align * align;
  }
  size_t begin(int c) const { return std::min(c * chunk, length); }
  size_t size(int c) const { return std::min(begin(c) + chunk, length) - begin(c); }
  size_t offset(int c) const { return base + begin(c); }
};

// Appends `step` unless it moves nothing: both ends of a transfer compute
// the same sizes, so both skip it.
inline void addStep(Plan& plan, const Step& step) {
  if (step.count > 0) plan.steps.push_back(step);
}

inline Step localCopy(size_t srcOffset, size_t dstOffset, size_t count, bool finalize) {
  Step step;
  step.kind = StepKind::Copy;
  step.srcOffset = srcOffset;
  step.dstOffset = dstOffset;
  step.count = count;
  step.finalize = finalize;
  return step;
}

}  // namespace braid::algo
