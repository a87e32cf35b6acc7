// Rabenseifner all-reduce: reduce-scatter by recursive halving, then
// all-gather by recursive doubling.
//
// The ranks fold onto p = 2^floor(log2 n) active ones as in recursive
// doubling (2i adds its input into 2i+1's first, and gets the result back at
// the end). The buffer is cut into p parts. Halving: active rank a keeps the
// half of its current range of parts that holds part a, sends the other half
// to a^(p/2), a^(p/4), ..., a^1 in turn and adds what it gets for the half it
// keeps, so it ends owning part a, fully reduced. Doubling: with a^1, a^2,
// ..., a^(p/2) it swaps the block of parts it owns for its partner's. Each
// active rank sends and receives 2(p-1)/p * S bytes in 2 log2(p) steps:
// the ring's bandwidth with the latency of recursive doubling.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan rabenseifnerAllReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (trivialReduction(shape, shape.count, plan)) return plan;
  const Fold fold(n);
  const int a = fold.active(r);
  const size_t chunk = shape.chunkElems;
  // Part i of p, chunk-aligned as the ring's.
  const Parts parts(0, shape.count, fold.p, shape.alignElems);
  auto partsSpan = [&](int first, int count) {
    return Span{parts.begin(first), parts.begin(first + count) - parts.begin(first)};
  };
  const Span whole{0, shape.count};

  Buffer current = addFoldIn(plan, fold, r, whole, chunk);
  if (a >= 0) {
    // Halving: this rank ends owning part a, fully reduced.
    for (const HalvingStep& halving : halvingSteps(fold.p, a)) {
      const int partner = fold.rankOf(a ^ halving.mask);
      Step add;
      add.kind = StepKind::RecvReduceCopy;
      add.src = current;
      add.dst = Buffer::Output;
      add.finalize = halving.mask == 1;
      addExchange(plan, partner, partsSpan(halving.give, halving.parts), current, partner,
                  partsSpan(halving.keep, halving.parts), add, chunk);
      current = Buffer::Output;
    }
    // Doubling: with the rank at a ^ mask, swap the blocks of `mask` parts
    // that each owns.
    for (int mask = 1; mask < fold.p; mask *= 2) {
      const int partner = a ^ mask;
      const Span mine = partsSpan(a / mask * mask, mask);
      const Span theirs = partsSpan(partner / mask * mask, mask);
      Step get;
      get.kind = StepKind::Recv;
      get.dst = Buffer::Output;
      addExchange(plan, fold.rankOf(partner), mine, Buffer::Output, fold.rankOf(partner), theirs,
                  get, chunk, /*settledOut=*/true);
    }
  }
  addFoldOut(plan, fold, r, whole, chunk);
  return plan;
}

}  // namespace braid::algo
