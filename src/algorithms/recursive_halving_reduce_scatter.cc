// Recursive-halving reduce-scatter, for power-of-two rank counts.
//
// Rank r starts with all n blocks. With r^(n/2), r^(n/4), ..., r^1 in turn
// it keeps the half of its current range of blocks that holds block r,
// sends the other half and adds what the partner sends for the half it
// keeps; after log2(n) steps it holds block r, fully reduced. Each rank
// sends (n-1)/n * n*S bytes for an S-byte output in log2(n) steps (the ring
// needs n-1). Partial sums live in a scratch area the size of the input.
#include "algorithms/plan.h"
#include "algorithms/ring.h"

namespace braid::algo {

Plan recursiveHalvingReduceScatter(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t block = shape.count;
  Plan plan;
  if (trivialReduction(shape, block, plan)) return plan;
  plan.scratchBytes = static_cast<size_t>(n) * block * shape.elemSize;
  auto blocks = [&](int first, int count) {
    return Span{static_cast<size_t>(first) * block, static_cast<size_t>(count) * block};
  };
  Buffer current = Buffer::Input;
  int lo = 0, size = n;
  for (int mask = n / 2; mask >= 1; mask /= 2) {
    size /= 2;
    const bool upper = (r & mask) != 0;
    const Span keep = blocks(upper ? lo + size : lo, size);
    const Span give = blocks(upper ? lo : lo + size, size);
    if (upper) lo += size;
    const bool last = mask == 1;  // keep is block r: it goes to the output
    Step add;
    add.kind = StepKind::RecvReduceCopy;
    add.src = current;
    add.dst = last ? Buffer::Output : Buffer::Scratch;
    add.finalize = last;
    addExchange(plan, r ^ mask, give, current, r ^ mask, keep, add, shape.chunkElems,
                /*settledOut=*/false, last ? 0 : kSameAsIn);
    current = Buffer::Scratch;
  }
  return plan;
}

}  // namespace braid::algo
