// Recursive-doubling all-reduce, for small buffers at any rank count.
//
// The ranks fold onto p = 2^floor(log2 n) active ones (ring.h's Fold: rank
// 2i adds its input into 2i+1's first). Active rank a then exchanges its
// whole partial result with a^1, a^2, ..., a^(p/2), adding what it gets each
// time, and at the end 2i+1 hands the result back to 2i. log2(p) exchanges
// of S bytes (plus one each way on the folded pairs): latency of log2(p)
// (+2) hops instead of the ring's 2(n-1), at the price of log2(p) * S bytes
// sent per rank. Both partners add the same two operands, so every rank ends
// with bitwise the same result.
#include "algorithms/plan.h"
#include "algorithms/ring.h"

namespace braid::algo {

Plan recursiveDoublingAllReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  if (n == 1) {
    addStep(plan, localCopy(0, 0, shape.count, /*finalize=*/true));
    return plan;
  }
  const Fold fold(n);
  const int a = fold.active(r);
  for (size_t base = 0; base < shape.count; base += shape.chunkElems) {
    const Span whole{base, std::min(shape.chunkElems, shape.count - base)};
    Buffer current = Buffer::Input;  // where this rank's partial result is
    if (fold.handsOn(r)) {
      addExchange(plan, r + 1, whole, Buffer::Input, r + 1, {0, 0}, Step{}, whole.count);
    } else if (fold.takesOver(r)) {
      Step add;
      add.kind = StepKind::RecvReduceCopy;
      add.src = Buffer::Input;
      add.dst = Buffer::Output;
      addExchange(plan, r - 1, {0, 0}, Buffer::Input, r - 1, whole, add, whole.count);
      current = Buffer::Output;
    }
    if (a >= 0) {
      for (int mask = 1; mask < fold.p; mask <<= 1) {
        Step add;
        add.kind = StepKind::RecvReduceCopy;
        add.src = current;
        add.dst = Buffer::Output;
        add.finalize = mask * 2 == fold.p;
        addExchange(plan, fold.rankOf(a ^ mask), whole, current, fold.rankOf(a ^ mask), whole, add,
                    whole.count);
        current = Buffer::Output;
      }
    }
    if (fold.takesOver(r)) {
      addExchange(plan, r - 1, whole, Buffer::Output, r - 1, {0, 0}, Step{}, whole.count,
                  /*settledOut=*/true);
    } else if (fold.handsOn(r)) {
      Step get;
      get.kind = StepKind::Recv;
      get.dst = Buffer::Output;
      addExchange(plan, r + 1, {0, 0}, Buffer::Output, r + 1, whole, get, whole.count);
    }
  }
  return plan;
}

}  // namespace braid::algo
