// Binomial-tree reduce.
//
// The mirror of the binomial broadcast: in ranks relative to the root, v
// adds the data of v + 2^k for every 2^k below lowbit(v) (smallest subtree
// first, as those are ready first) to its own input and sends the sum to
// v - lowbit(v). ceil(log2 n) hops; a rank with c children receives c * S
// bytes and sends S. A non-root rank sums in the scratch area, so chunks
// are at most kScratchBytes.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan binomialReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  const BinomialNode node(n, r, shape.root);
  const int parent = node.parent;
  const std::vector<int>& children = node.children;  // smallest subtree first
  const bool root = parent < 0;
  const size_t scratchElems = std::max(
      shape.alignElems, kScratchBytes / shape.elemSize / shape.alignElems * shape.alignElems);
  const size_t chunk = std::min(shape.chunkElems, scratchElems);  // the same on every rank
  for (size_t base = 0; base < shape.count; base += chunk) {
    const size_t count = std::min(chunk, shape.count - base);
    // The running sum: the output at the root, the scratch area elsewhere.
    const Buffer sum = root ? Buffer::Output : Buffer::Scratch;
    const size_t sumOffset = root ? base : 0;
    Step step;
    step.count = count;
    if (children.empty()) {
      if (root) {
        addStep(plan, localCopy(base, base, count, /*finalize=*/true));
      } else {
        step.kind = StepKind::Send;
        step.sendPeer = parent;
        step.srcOffset = base;
        addStep(plan, step);
      }
      continue;
    }
    step.src = Buffer::Input;
    step.srcOffset = base;
    for (size_t c = 0; c < children.size(); ++c) {
      step.recvPeer = children[c];
      if (c + 1 == children.size() && !root) {
        step.kind = StepKind::RecvReduceSend;
        step.sendPeer = parent;
      } else {
        step.kind = StepKind::RecvReduceCopy;
        step.dst = sum;
        step.dstOffset = sumOffset;
        step.finalize = root && c + 1 == children.size();
      }
      addStep(plan, step);
      step.src = sum;
      step.srcOffset = sumOffset;
    }
  }
  return plan;
}

}  // namespace braid::algo
