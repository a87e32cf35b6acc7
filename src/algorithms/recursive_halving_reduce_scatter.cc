// Recursive-halving reduce-scatter, for power-of-two rank counts.
//
// Rank r starts with all n blocks. With r^(n/2), r^(n/4), ..., r^1 in turn
// it keeps the half of its current range of blocks that holds block r,
// sends the other half and adds what the partner sends for the half it
// keeps; after log2(n) steps it holds block r, fully reduced. Each rank
// sends (n-1)/n * n*S bytes for an S-byte output in log2(n) steps (the ring
// needs n-1). Partial sums live in a scratch area the size of the input.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

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
  for (const HalvingStep& halving : halvingSteps(n, r)) {
    const int partner = r ^ halving.mask;
    const bool last = halving.mask == 1;  // the kept half is block r: it goes to the output
    Step add;
    add.kind = StepKind::RecvReduceCopy;
    add.src = current;
    add.dst = last ? Buffer::Output : Buffer::Scratch;
    add.finalize = last;
    addExchange(plan, partner, blocks(halving.give, halving.parts), current, partner,
                blocks(halving.keep, halving.parts), add, shape.chunkElems,
                /*settledOut=*/false, last ? 0 : kSameAsIn);
    current = Buffer::Scratch;
  }
  return plan;
}

}  // namespace braid::algo
