// Hierarchical reduce-scatter, for ranks spread over hosts (partition.h's Hosts:
// L = Shape::localRanks ranks on each of H hosts). REQUIRES: L >= 2, H >= 2.
//
// Per piece of the S-element blocks, rank l of the L on host h (of H):
//   1. for each host g in turn, a ring reduce-scatter within the host of
//      the blocks of g's ranks: rank l ends with its host's sum of block
//      gL + l, in scratch (H pieces);
//   2. a ring reduce-scatter of those H partial sums across hosts, among
//      the ranks with local number l: rank hL + l ends with its own block
//      summed over every rank.
// Per rank (L-1) * H * S bytes within the host and (H-1) * S across hosts
// (the flat ring: (n-1) * S over each link, those that leave a host
// included).
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/ring.h"
#include "algorithms/steps.h"

namespace braid::algo {
namespace {

// The most scratch the partial sums take: pieces shrink below a chunk
// where H of them would need more.
constexpr size_t kPartialsBytes = size_t{4} << 20;

}  // namespace

Plan hierarchicalReduceScatter(const Shape& shape) {
  const size_t block = shape.count;
  Plan plan;
  if (trivialReduction(shape, block, plan)) return plan;
  const Hosts hosts(shape);
  const int L = hosts.L, H = hosts.H, h = hosts.host, l = hosts.local;
  const size_t align = shape.alignElems;
  const size_t fit = kPartialsBytes / shape.elemSize / static_cast<size_t>(H) / align * align;
  const size_t piece = std::min(shape.chunkElems, std::max(align, fit));
  plan.scratchBytes = static_cast<size_t>(H) * piece * shape.elemSize;
  const Ring withinHost{L, l, hosts.rankOf(h, l - 1), hosts.rankOf(h, l + 1)};
  const Ring acrossHosts{H, h, hosts.rankOf(h - 1, l), hosts.rankOf(h + 1, l)};
  for (size_t base = 0; base < block; base += piece) {
    const size_t length = std::min(piece, block - base);
    // 1. Within the host, for the blocks of each host g: the host's sum of
    // block gL + l lands in partial g of the scratch area.
    for (int g = 0; g < H; ++g)
      addRingReduceScatter(plan, withinHost, /*finalize=*/false, [&](Step step, int j) {
        step.srcOffset = static_cast<size_t>(hosts.rankOf(g, j)) * block + base;
        step.dst = Buffer::Scratch;
        step.dstOffset = static_cast<size_t>(g) * piece;
        step.count = length;
        return step;
      });
    // 2. Across hosts, over the partial sums.
    addRingReduceScatter(plan, acrossHosts, /*finalize=*/true, [&](Step step, int j) {
      step.src = Buffer::Scratch;
      step.srcOffset = static_cast<size_t>(ringIndex(j, H)) * piece;
      step.dstOffset = base;
      step.count = length;
      return step;
    });
  }
  return plan;
}

}  // namespace braid::algo
