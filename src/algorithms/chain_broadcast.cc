// Pipelined chain broadcast.
//
// The ranks form a chain starting at the root: root, root+1, ..., root-1.
// The root sends every chunk to its successor, every middle rank keeps and
// forwards each piece as it arrives, the last rank keeps it. Chunks stream,
// so the time is about (n - 1 + chunks) piece hops, not (n - 1) * S.
#include "algorithms/plan.h"
#include "algorithms/ring.h"

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
    Step step;
    step.srcOffset = step.dstOffset = base;
    step.count = std::min(shape.chunkElems, shape.count - base);
    if (position == 0) {
      step.kind = StepKind::Send;
      step.sendPeer = next;
    } else if (position < n - 1) {
      step.kind = StepKind::RecvCopySend;
      step.recvPeer = prev;
      step.sendPeer = next;
      step.settled = true;
    } else {
      step.kind = StepKind::Recv;
      step.recvPeer = prev;
    }
    addStep(plan, step);
  }
  if (position == 0) addStep(plan, localCopy(0, 0, shape.count, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
