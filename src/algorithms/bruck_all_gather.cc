// Bruck all-gather, at any rank count.
//
// In round k (distance d = 2^k) rank r, which holds blocks r .. r+d-1 (mod
// n), sends the first min(d, n-d) of them to r-d and receives as many,
// r+d .. , from r+d. Blocks go straight to their place in the output (a
// range that wraps past the last block travels as two messages), so no
// rotation is needed at the end. ceil(log2 n) rounds; each rank sends and
// receives (n-1) * S bytes for an S-byte input.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {
namespace {

// Blocks [first, first + count) mod n as at most two element spans.
std::vector<Span> blockSpans(int first, int count, int n, size_t block) {
  std::vector<Span> spans;
  const int head = std::min(count, n - first);
  spans.push_back({first * block, static_cast<size_t>(head) * block});
  if (count > head) spans.push_back({0, static_cast<size_t>(count - head) * block});
  return spans;
}

}  // namespace

Plan bruckAllGather(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t block = shape.count;
  Plan plan;
  if (block == 0) return plan;
  addStep(plan, localCopy(0, r * block, block, /*finalize=*/false));
  for (int d = 1; d < n; d *= 2) {
    const int count = std::min(d, n - d);
    const std::vector<Span> out = blockSpans(r, count, n, block);
    const std::vector<Span> in = blockSpans(ringIndex(r + d, n), count, n, block);
    // Both lists split at a wrap; pair their pieces up in order, as the
    // partners do the same.
    Step recv;
    recv.kind = StepKind::Recv;
    recv.dst = Buffer::Output;
    const size_t pieces = std::max(out.size(), in.size());
    for (size_t i = 0; i < pieces; ++i) {
      addExchange(plan, ringIndex(r - d, n), i < out.size() ? out[i] : Span{0, 0}, Buffer::Output,
                  ringIndex(r + d, n), i < in.size() ? in[i] : Span{0, 0}, recv, shape.chunkElems,
                  /*settledOut=*/true);
    }
  }
  return plan;
}

}  // namespace braid::algo
