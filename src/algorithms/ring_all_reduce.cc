// Ring all-reduce.
//
// Per round of n chunks, rank r:
//   reduce-scatter  step 0       send chunk r-1
//                   steps 1..n-2 receive chunk r-1-s, add own, send on
//                   step n-1     receive chunk r, add own: final, keep and send on
//   all-gather      steps 1..n-2 receive chunk r-k, keep and send on
//                   last         receive chunk r+1, keep
// 2(n-1) transfers per round, each of S/n bytes: 2(n-1)/n * S per rank.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan ringAllReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (trivialReduction(shape, shape.count, plan)) return plan;
  const int next = ringIndex(r + 1, n);
  const int prev = ringIndex(r - 1, n);
  const size_t roundElems = shape.chunkElems * n;
  for (size_t base = 0; base < shape.count; base += roundElems) {
    Parts round(base, std::min(roundElems, shape.count - base), n, shape.alignElems);
    auto step = [&](StepKind kind, int chunk) {
      int c = ringIndex(chunk, n);
      Step s;
      s.kind = kind;
      s.sendPeer = next;
      s.recvPeer = prev;
      s.srcOffset = s.dstOffset = round.offset(c);
      s.count = round.size(c);
      return s;
    };
    addStep(plan, step(StepKind::Send, r - 1));
    for (int s = 1; s <= n - 2; ++s) addStep(plan, step(StepKind::RecvReduceSend, r - 1 - s));
    Step owned = step(StepKind::RecvReduceCopySend, r);
    owned.finalize = true;
    owned.settled = true;
    addStep(plan, owned);
    for (int k = 1; k <= n - 2; ++k) {
      Step pass = step(StepKind::RecvCopySend, r - k);
      pass.settled = true;
      addStep(plan, pass);
    }
    addStep(plan, step(StepKind::Recv, r + 1));
  }
  return plan;
}

}  // namespace braid::algo
