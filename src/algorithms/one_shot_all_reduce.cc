// One-shot (direct) all-reduce, for small buffers.
//
// Rank r: send the input to r+1, r+2, ..., r-1 (n-1 steps); keep a copy of
// it in scratch (the output may be the input); then, for k = 0 .. n-1, fold
// rank k's input into the output: receive it from k, or take the copy when
// k == r. The fold order is the same on every rank, so the results are
// bitwise equal everywhere. One hop of latency instead of the ring's
// 2(n-1); (n-1) * S bytes each way. A single rank only copies its input.
// REQUIRES: S <= kScratchBytes (the copy of the input waits in scratch).
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan oneShotAllReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t count = shape.count;
  Plan plan;
  if (trivialReduction(shape, count, plan)) return plan;
  for (int k = 1; k < n; ++k) {
    Step send;
    send.kind = StepKind::Send;
    send.sendPeer = ringIndex(r + k, n);
    send.count = count;
    addStep(plan, send);
  }
  Step keep = localCopy(0, 0, count, /*finalize=*/false);
  keep.dst = Buffer::Scratch;
  addStep(plan, keep);
  for (int k = 0; k < n; ++k) {
    Step fold;
    fold.count = count;
    fold.finalize = k == n - 1;
    if (k == r) {
      fold.kind = k == 0 ? StepKind::Copy : StepKind::Reduce;
      fold.src = Buffer::Scratch;
    } else {
      fold.kind = k == 0 ? StepKind::Recv : StepKind::RecvReduceCopy;
      fold.recvPeer = k;
      fold.src = Buffer::Output;
    }
    addStep(plan, fold);
  }
  return plan;
}

}  // namespace braid::algo
