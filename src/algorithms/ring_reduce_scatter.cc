// Ring reduce-scatter.
//
// Rank r sends block r-1 to r+1, then n-2 times receives block r-1-s, adds
// its own and passes it on, and finally receives block r, adds its own and
// keeps the result. Blocks are streamed in rounds of at most one chunk. n-1
// transfers of S bytes per rank for an S-byte output.
#include "algorithms/plan.h"
#include "algorithms/ring.h"

namespace braid::algo {

Plan ringReduceScatter(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t block = shape.count;
  Plan plan;
  if (trivialReduction(shape, block, plan)) return plan;
  const int next = ringIndex(r + 1, n);
  const int prev = ringIndex(r - 1, n);
  for (size_t base = 0; base < block; base += shape.chunkElems) {
    const size_t length = std::min(shape.chunkElems, block - base);
    for (int s = 0; s <= n - 1; ++s) {
      Step step;
      step.kind = s == 0 ? StepKind::Send
                         : (s < n - 1 ? StepKind::RecvReduceSend : StepKind::RecvReduceCopy);
      step.sendPeer = s < n - 1 ? next : -1;
      step.recvPeer = s > 0 ? prev : -1;
      step.srcOffset = ringIndex(r - 1 - s, n) * block + base;
      step.dstOffset = base;
      step.count = length;
      step.finalize = s == n - 1;
      addStep(plan, step);
    }
  }
  return plan;
}

}  // namespace braid::algo
