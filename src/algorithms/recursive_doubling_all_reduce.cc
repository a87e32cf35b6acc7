// Recursive-doubling all-reduce, for small buffers at any rank count.
//
// The ranks fold onto p = 2^floor(log2 n) active ones (partition.h's Fold:
// rank 2i adds its input into 2i+1's first). Active rank a then exchanges its
// whole partial result with a^1, a^2, ..., a^(p/2), adding what it gets each
// time, and at the end 2i+1 hands the result back to 2i. log2(p) exchanges
// of S bytes (plus one each way on the folded pairs): latency of log2(p)
// (+2) hops instead of the ring's 2(n-1), at the price of log2(p) * S bytes
// sent per rank. Both partners add the same two operands, so every rank ends
// with bitwise the same result.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan recursiveDoublingAllReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (trivialReduction(shape, shape.count, plan)) return plan;
  const Fold fold(n);
  const int a = fold.active(r);
  for (size_t base = 0; base < shape.count; base += shape.chunkElems) {
    const Span whole{base, std::min(shape.chunkElems, shape.count - base)};
    // Where this rank's partial result is.
    Buffer current = addFoldIn(plan, fold, r, whole, whole.count);
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
    addFoldOut(plan, fold, r, whole, whole.count);
  }
  return plan;
}

}  // namespace braid::algo
