// Ring all-gather.
//
// Rank r sends its own block to r+1, then n-2 times receives the block of
// r-k, keeps it and passes it on, and finally receives the block of r+1.
// Blocks are streamed in rounds of at most one chunk. n-1 steps per round;
// n-1 transfers of S bytes per rank for an S-byte input; its own block is
// copied locally last (nothing to copy in place).
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/ring.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan ringAllGather(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t block = shape.count;
  Plan plan;
  if (block == 0) return plan;
  const Ring ring{n, r, ringIndex(r - 1, n), ringIndex(r + 1, n)};
  for (size_t base = 0; n > 1 && base < block; base += shape.chunkElems) {
    const size_t length = std::min(shape.chunkElems, block - base);
    // Its own block's piece is read from Input; the others land at their
    // block's place in Output.
    addRingAllGather(plan, ring, [&](Step step, int j) {
      if (step.kind == StepKind::Send)
        step.srcOffset = base;
      else
        step.dstOffset = ringIndex(j, n) * block + base;
      step.count = length;
      return step;
    });
  }
  addStep(plan, localCopy(0, r * block, block, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
