// Binomial-tree broadcast.
//
// In ranks relative to the root (v = r - root mod n), v receives from
// v - lowbit(v) and sends to v + 2^k for every 2^k below lowbit(v) (the root:
// every 2^k < n), largest subtree first. ceil(log2 n) hops for a chunk; the
// root sends up to log2(n) * S bytes, every other rank receives S bytes.
// Chunks stream, so a deep rank starts forwarding chunk 0 while its parent
// still sends it chunk 1.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan binomialBroadcast(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  const BinomialNode node(n, r, shape.root);
  const int parent = node.parent;
  const std::vector<int> children(node.children.rbegin(), node.children.rend());  // largest first
  for (size_t base = 0; n > 1 && base < shape.count; base += shape.chunkElems) {
    Step step;
    step.srcOffset = step.dstOffset = base;
    step.count = std::min(shape.chunkElems, shape.count - base);
    size_t next = 0;
    if (parent >= 0) {
      step.recvPeer = parent;
      step.dst = Buffer::Output;
      if (children.empty()) {
        step.kind = StepKind::Recv;
      } else {
        step.kind = StepKind::RecvCopySend;
        step.sendPeer = children[next++];
        step.settled = true;
      }
      addStep(plan, step);
    }
    // The root sends from its input; the others pass on what they kept.
    step.kind = StepKind::Send;
    step.recvPeer = -1;
    step.src = parent >= 0 ? Buffer::Output : Buffer::Input;
    step.settled = parent >= 0;
    for (; next < children.size(); ++next) {
      step.sendPeer = children[next];
      addStep(plan, step);
    }
  }
  if (parent < 0) addStep(plan, localCopy(0, 0, shape.count, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
