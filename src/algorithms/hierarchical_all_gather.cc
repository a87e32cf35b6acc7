// Hierarchical all-gather, for ranks spread over hosts.
//
// Rank l of the L on host h (of H), for S-byte blocks:
//   1. around the ring of hosts among the ranks with local number l, the
//      blocks of those H ranks (h'L + l for every host h');
//   2. around the host's ring, each rank's H blocks: after L-1 steps every
//      rank has all n.
// Per rank (H-1) * S bytes across hosts (the flat ring: (n-1) * S over
// each link, those that leave a host included) and (L-1) * H * S within.
// Its own block is copied locally last (nothing to copy in place).
#include "algorithms/plan.h"
#include "algorithms/ring.h"

namespace braid::algo {

Plan hierarchicalAllGather(const Shape& shape) {
  const size_t block = shape.count;
  Plan plan;
  if (block == 0) return plan;
  const Hosts hosts(shape);
  const int L = hosts.L, H = hosts.H, h = hosts.host, l = hosts.local;
  // A ring all-gather of elements [base, base + length) of the blocks
  // blockOf(j) of the `count` ranks j of a ring, received from `prev` and
  // passed on to `next`, by the rank at position `me`, whose own block is
  // read at `ownOffset` of `ownBuffer`.
  auto gather = [&](int count, int me, int prev, int next, auto blockOf, size_t base, size_t length,
                    Buffer ownBuffer, size_t ownOffset) {
    Step send;
    send.kind = StepKind::Send;
    send.sendPeer = next;
    send.src = ownBuffer;
    send.srcOffset = ownOffset + base;
    send.count = length;
    send.settled = ownBuffer == Buffer::Output;
    addStep(plan, send);
    for (int k = 1; k <= count - 1; ++k) {
      Step s;
      s.kind = k < count - 1 ? StepKind::RecvCopySend : StepKind::Recv;
      s.recvPeer = prev;
      s.sendPeer = k < count - 1 ? next : -1;
      s.dstOffset = blockOf(me - k) * block + base;
      s.count = length;
      s.settled = k < count - 1;  // what it passes on is final
      addStep(plan, s);
    }
  };

  // 1. Across hosts.
  for (size_t base = 0; base < block; base += shape.chunkElems)
    gather(
        H, h, hosts.rankOf(h - 1, l), hosts.rankOf(h + 1, l),
        [&](int g) { return static_cast<size_t>(hosts.rankOf(g, l)); }, base,
        std::min(shape.chunkElems, block - base), Buffer::Input, 0);
  // 2. Within the host, the blocks of host g's ranks in turn.
  for (int g = 0; g < H; ++g)
    for (size_t base = 0; base < block; base += shape.chunkElems) {
      const bool mine = g == h;  // this rank's own block is still only in Input
      gather(
          L, l, hosts.rankOf(h, l - 1), hosts.rankOf(h, l + 1),
          [&](int j) { return static_cast<size_t>(hosts.rankOf(g, j)); }, base,
          std::min(shape.chunkElems, block - base), mine ? Buffer::Input : Buffer::Output,
          mine ? 0 : static_cast<size_t>(hosts.rankOf(g, l)) * block);
    }
  addStep(plan, localCopy(0, shape.rank * block, block, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
