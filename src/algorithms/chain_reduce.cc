// Pipelined chain reduce.
//
// The chain runs root+1, root+2, ..., root: the first rank sends its input,
// every middle rank adds its own to each piece as it arrives and forwards
// it, the root adds its own and keeps the result. Time is about
// (n - 1 + chunks) piece hops.
#include "algorithms/plan.h"
#include "algorithms/ring.h"

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
    Step step;
    step.srcOffset = step.dstOffset = base;
    step.count = std::min(shape.chunkElems, shape.count - base);
    if (position == 0) {
      step.kind = StepKind::Send;
      step.sendPeer = next;
    } else if (position < n - 1) {
      step.kind = StepKind::RecvReduceSend;
      step.recvPeer = prev;
      step.sendPeer = next;
    } else {
      step.kind = StepKind::RecvReduceCopy;
      step.recvPeer = prev;
      step.finalize = true;
    }
    addStep(plan, step);
  }
  return plan;
}

}  // namespace braid::algo
