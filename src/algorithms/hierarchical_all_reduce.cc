// Hierarchical all-reduce, for ranks spread over hosts (partition.h's Hosts:
// L = Shape::localRanks ranks on each of H hosts). REQUIRES: L >= 2, H >= 2.
//
// The links within a host carry most of the bytes; the H rings across
// hosts, one per local rank, carry a 1/L share each, so every local rank's
// network link works at once.
//
// A round of n chunks is L shards of H pieces. Rank l of the L on host h
// (of H):
//   1. reduce-scatter within the host, around the host's ring, piece by
//      piece: rank l ends with shard l, summed over its host (in Output);
//   2. ring all-reduce of shard l across hosts, among the H ranks with
//      local number l, in place: shard l is final on all of them;
//   3. ring all-gather of the shards within the host, piece by piece.
// No step moves more than a chunk.
// Per rank 2(L-1)/L * S bytes within the host and 2(H-1)/H * S/L across
// hosts, where the flat ring sends 2(n-1)/n * S over each of its links,
// those that leave a host included.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan hierarchicalAllReduce(const Shape& shape) {
  Plan plan;
  if (trivialReduction(shape, shape.count, plan)) return plan;
  const Hosts hosts(shape);
  const int L = hosts.L, H = hosts.H, h = hosts.host, l = hosts.local;
  const size_t roundElems = shape.chunkElems * shape.nranks;
  for (size_t base = 0; base < shape.count; base += roundElems) {
    const Parts shards(base, std::min(roundElems, shape.count - base), L, shape.alignElems);
    auto piecesOf = [&](int j) {
      return Parts(shards.offset(ringIndex(j, L)), shards.size(ringIndex(j, L)), H,
                   shape.alignElems);
    };
    // A step around the host's ring on piece `c` of shard `j`, or around the
    // ring of hosts on piece `c` of this rank's shard.
    auto withinHost = [&](StepKind kind, int j, int c, Buffer src) {
      const Parts pieces = piecesOf(j);
      Step s;
      s.kind = kind;
      s.sendPeer = hosts.rankOf(h, l + 1);
      s.recvPeer = hosts.rankOf(h, l - 1);
      s.src = src;
      s.srcOffset = s.dstOffset = pieces.offset(c);
      s.count = pieces.size(c);
      return s;
    };
    const Parts mine = piecesOf(l);
    auto acrossHosts = [&](StepKind kind, int c) {
      Step s;
      s.kind = kind;
      s.sendPeer = hosts.rankOf(h + 1, l);
      s.recvPeer = hosts.rankOf(h - 1, l);
      s.src = Buffer::Output;
      s.srcOffset = s.dstOffset = mine.offset(ringIndex(c, H));
      s.count = mine.size(ringIndex(c, H));
      return s;
    };
    auto settled = [](Step s) {
      s.settled = true;
      return s;
    };

    // 1. Reduce-scatter within the host.
    for (int c = 0; c < H; ++c) {
      addStep(plan, withinHost(StepKind::Send, l - 1, c, Buffer::Input));
      for (int s = 1; s <= L - 2; ++s)
        addStep(plan, withinHost(StepKind::RecvReduceSend, l - 1 - s, c, Buffer::Input));
      addStep(plan, withinHost(StepKind::RecvReduceCopy, l, c, Buffer::Input));
    }

    // 2. All-reduce of this rank's shard across hosts.
    addStep(plan, acrossHosts(StepKind::Send, h - 1));
    for (int s = 1; s <= H - 2; ++s)
      addStep(plan, acrossHosts(StepKind::RecvReduceSend, h - 1 - s));
    Step owned = settled(acrossHosts(StepKind::RecvReduceCopySend, h));
    owned.finalize = true;
    addStep(plan, owned);
    for (int k = 1; k <= H - 2; ++k)
      addStep(plan, settled(acrossHosts(StepKind::RecvCopySend, h - k)));
    addStep(plan, acrossHosts(StepKind::Recv, h + 1));

    // 3. All-gather of the shards within the host.
    for (int c = 0; c < H; ++c) {
      addStep(plan, settled(withinHost(StepKind::Send, l, c, Buffer::Output)));
      for (int k = 1; k <= L - 2; ++k)
        addStep(plan, settled(withinHost(StepKind::RecvCopySend, l - k, c, Buffer::Output)));
      addStep(plan, withinHost(StepKind::Recv, l + 1, c, Buffer::Output));
    }
  }
  return plan;
}

}  // namespace braid::algo
