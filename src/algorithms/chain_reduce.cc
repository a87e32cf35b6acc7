// Pipelined chain reduce.
//
// The chain runs root+1, root+2, ..., root: the first rank sends its input,
// every middle rank adds its own to each piece as it arrives and forwards
// it, the root adds its own and keeps the result. Every rank but the root
// sends S bytes and every rank but the first receives S bytes; the time is
// about (n - 1 + chunks) piece hops.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan chainReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (trivialReduction(shape, shape.count, plan)) return plan;
  const int position = ringIndex(r - shape.root - 1, n);
  const int next = ringIndex(r + 1, n);
  const int prev = ringIndex(r - 1, n);
  for (size_t base = 0; base < shape.count; base += shape.chunkElems) {
    Step step =
        chainLink(position, n, prev, next, StepKind::RecvReduceSend, StepKind::RecvReduceCopy);
    step.srcOffset = step.dstOffset = base;
    step.count = std::min(shape.chunkElems, shape.count - base);
    step.finalize = step.kind == StepKind::RecvReduceCopy;  // at the root
    addStep(plan, step);
  }
  return plan;
}

}  // namespace braid::algo
