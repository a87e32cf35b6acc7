// Ring reduce-scatter.
//
// Rank r sends block r-1 to r+1, then n-2 times receives block r-1-s, adds
// its own and passes it on, and finally receives block r, adds its own and
// keeps the result. Blocks are streamed in rounds of at most one chunk. n-1
// steps per round; n-1 transfers of S bytes per rank for an S-byte output.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/ring.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan ringReduceScatter(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t block = shape.count;
  Plan plan;
  if (trivialReduction(shape, block, plan)) return plan;
  const Ring ring{n, r, ringIndex(r - 1, n), ringIndex(r + 1, n)};
  for (size_t base = 0; base < block; base += shape.chunkElems) {
    const size_t length = std::min(shape.chunkElems, block - base);
    // Each block's piece is read at its place in Input; the sum lands at
    // the piece's place in Output.
    addRingReduceScatter(plan, ring, /*finalize=*/true, [&](Step step, int j) {
      step.srcOffset = ringIndex(j, n) * block + base;
      step.dstOffset = base;
      step.count = length;
      return step;
    });
  }
  return plan;
}

}  // namespace braid::algo
