// Ring all-gather.
//
// Rank r sends its own block to r+1, then n-2 times receives the block of
// r-k, keeps it and passes it on, and finally receives the block of r+1.
// Blocks are streamed in rounds of at most one chunk. n-1 transfers of S
// bytes per rank for an S-byte input; its own block is copied locally last
// (nothing to copy in place).
#include "algorithms/plan.h"
#include "algorithms/ring.h"

namespace braid::algo {

Plan ringAllGather(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  const size_t block = shape.count;
  Plan plan;
  if (block == 0) return plan;
  const int next = ringIndex(r + 1, n);
  const int prev = ringIndex(r - 1, n);
  for (size_t base = 0; n > 1 && base < block; base += shape.chunkElems) {
    const size_t length = std::min(shape.chunkElems, block - base);
    Step send;
    send.kind = StepKind::Send;
    send.sendPeer = next;
    send.src = Buffer::Input;
    send.srcOffset = base;
    send.count = length;
    addStep(plan, send);
    for (int k = 1; k <= n - 1; ++k) {
      Step s;
      s.kind = k < n - 1 ? StepKind::RecvCopySend : StepKind::Recv;
      s.recvPeer = prev;
      s.sendPeer = k < n - 1 ? next : -1;
      s.dstOffset = ringIndex(r - k, n) * block + base;
      s.count = length;
      s.settled = k < n - 1;  // what it passes on is final
      addStep(plan, s);
    }
  }
  addStep(plan, localCopy(0, r * block, block, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
