// Hierarchical broadcast, for ranks spread over hosts (partition.h's Hosts:
// L = Shape::localRanks ranks on each of H hosts). REQUIRES: L >= 2, H >= 2.
//
// Per round of L chunks (parts), the root being a rank of host hr:
//   1. on the root's host, the root sends part j to local rank j;
//   2. part l goes down the chain of hosts hr, hr+1, ... among the ranks
//      with local number l, each piece forwarded as it arrives;
//   3. each host all-gathers the parts around its ring.
// Per rank S/L bytes across hosts (the flat chain: S over each link) and
// (L-1)/L * S within; the root also sends (L-1)/L * S within its host.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/ring.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan hierarchicalBroadcast(const Shape& shape) {
  Plan plan;
  if (shape.count == 0) return plan;
  const Hosts hosts(shape);
  const int L = hosts.L, H = hosts.H, h = hosts.host, l = hosts.local;
  const int rootHost = shape.root / L;
  const bool root = shape.rank == shape.root;
  // The root reads its parts from Input (its Output is written last) and
  // receives in step 3 what it already has, so nothing it sends from
  // Output is settled.
  const Buffer own = root ? Buffer::Input : Buffer::Output;
  const int position = ringIndex(h - rootHost, H);  // in the chain of hosts
  const size_t roundElems = shape.chunkElems * L;
  const Ring withinHost{L, l, hosts.rankOf(h, l - 1), hosts.rankOf(h, l + 1)};
  for (size_t base = 0; base < shape.count; base += roundElems) {
    const Parts parts(base, std::min(roundElems, shape.count - base), L, shape.alignElems);
    auto part = [&](StepKind kind, int j, int sendPeer, int recvPeer) {
      Step s;
      s.kind = kind;
      s.sendPeer = sendPeer;
      s.recvPeer = recvPeer;
      s.src = own;
      s.srcOffset = s.dstOffset = parts.offset(ringIndex(j, L));
      s.count = parts.size(ringIndex(j, L));
      s.settled = !root && sends(kind);
      return s;
    };

    // 1. The root hands out the parts on its host.
    if (root) {
      for (int j = 0; j < L; ++j)
        if (j != l) addStep(plan, part(StepKind::Send, j, hosts.rankOf(h, j), -1));
    } else if (h == rootHost) {
      addStep(plan, part(StepKind::Recv, l, -1, shape.root));
    }

    // 2. Part l down the chain of hosts.
    const Step link = chainLink(position, H, hosts.rankOf(h - 1, l), hosts.rankOf(h + 1, l),
                                StepKind::RecvCopySend, StepKind::Recv);
    addStep(plan, part(link.kind, l, link.sendPeer, link.recvPeer));

    // 3. All-gather of the parts within the host.
    addRingAllGather(plan, withinHost, [&](const Step& step, int j) {
      return part(step.kind, j, step.sendPeer, step.recvPeer);
    });
  }
  if (root) addStep(plan, localCopy(0, 0, shape.count, /*finalize=*/false));
  return plan;
}

}  // namespace braid::algo
