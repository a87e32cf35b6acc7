// Hierarchical all-gather, for ranks spread over hosts (partition.h's Hosts:
// L = Shape::localRanks ranks on each of H hosts). REQUIRES: L >= 2, H >= 2.
//
// Rank l of the L on host h (of H), for S-byte blocks:
//   1. around the ring of hosts among the ranks with local number l, the
//      blocks of those H ranks (h'L + l for every host h');
//   2. around the host's ring, each rank's H blocks: after L-1 steps every
//      rank has all n.
// Per rank (H-1) * S bytes across hosts (the flat ring: (n-1) * S over
// each link, those that leave a host included) and (L-1) * H * S within.
// Its own block is copied locally last (nothing to copy in place).
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/ring.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan hierarchicalAllGather(const Shape& shape) {
  const size_t block = shape.count;
  Plan plan;
  if (block == 0) return plan;
  const Hosts hosts(shape);
  const int L = hosts.L, H = hosts.H, h = hosts.host, l = hosts.local;
  // Elements [base, base + chunk) of the blocks blockOf(j) of the members
  // j of `ring`, gathered around it: each lands at its block's place in
  // Output; this rank's own is read at `ownOffset` of `own`.
  auto gather = [&](const Ring& ring, auto blockOf, size_t base, Buffer own, size_t ownOffset) {
    addRingAllGather(plan, ring, [&](Step step, int j) {
      if (step.kind == StepKind::Send) {
        step.src = own;
        step.srcOffset = ownOffset + base;
        step.settled = own == Buffer::Output;
      } else {
        step.dstOffset = blockOf(j) * block + base;
      }
      step.count = std::min(shape.chunkElems, block - base);
      return step;
    });
  };

  // 1. Across hosts.
  const Ring acrossHosts{H, h, hosts.rankOf(h - 1, l), hosts.rankOf(h + 1, l)};
  for (size_t base = 0; base < block; base += shape.chunkElems)
    gather(
        acrossHosts, [&](int g) { return static_cast<size_t>(hosts.rankOf(g, l)); }, base,
        Buffer::Input, 0);
  // 2. Within the host, the blocks of host g's ranks in turn.
  const Ring withinHost{L, l, hosts.rankOf(h, l - 1), hosts.rankOf(h, l + 1)};
  for (int g = 0; g < H; ++g)
    for (size_t base = 0; base < block; base += shape.chunkElems) {
      const bool mine = g == h;  // this rank's own block is still only in Input
      gather(
          withinHost, [&](int j) { return static_cast<size_t>(hosts.rankOf(g, j)); }, base,
          mine ? Buffer::Input : Buffer::Output,
          mine ? 0 : static_cast<size_t>(hosts.rankOf(g, l)) * block);
    }
  addStep(plan, localCopy(0, shape.rank * block, block, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
