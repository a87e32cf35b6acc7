// Pipelined chain broadcast.
//
// The ranks form a chain starting at the root: root, root+1, ..., root-1.
// The root sends every chunk to its successor, every middle rank keeps and
// forwards each piece as it arrives, the last rank keeps it. Every rank but
// the last sends S bytes and every rank but the root receives S bytes;
// chunks stream, so the time is about (n - 1 + chunks) piece hops, not
// (n - 1) * S.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan chainBroadcast(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  const int position = ringIndex(r - shape.root, n);
  const int next = ringIndex(r + 1, n);
  const int prev = ringIndex(r - 1, n);
  for (size_t base = 0; n > 1 && base < shape.count; base += shape.chunkElems) {
    Step step = chainLink(position, n, prev, next, StepKind::RecvCopySend, StepKind::Recv);
    step.srcOffset = step.dstOffset = base;
    step.count = std::min(shape.chunkElems, shape.count - base);
    step.settled = step.kind == StepKind::RecvCopySend;  // what a middle rank passes on is final
    addStep(plan, step);
  }
  if (position == 0) addStep(plan, localCopy(0, 0, shape.count, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
