// Scatter + all-gather broadcast (van de Geijn), for large buffers.
//
// The buffer is cut into n parts. The root sends part q to rank q, then
// every rank passes parts around the ring as in the ring all-gather until
// each has all n. The root sends (n-1)/n * S bytes and every rank about
// 2(n-1)/n * S, instead of the chain's S per rank; 2(n-1) hops. The root
// takes part in the ring like everyone (it rewrites its output with the
// same values it already holds), which keeps the ring's messages uniform.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/ring.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan scatterAllGatherBroadcast(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  const bool root = r == shape.root;
  if (root) addStep(plan, localCopy(0, 0, shape.count, /*finalize=*/false));
  if (n == 1) return plan;
  const Parts parts(0, shape.count, n, shape.alignElems);
  const size_t chunk = shape.chunkElems;
  // Scatter: part q from the root to rank q.
  for (int q = 0; q < n; ++q) {
    if (q == shape.root || (!root && q != r)) continue;
    Step step;
    step.kind = root ? StepKind::Send : StepKind::Recv;
    (root ? step.sendPeer : step.recvPeer) = root ? q : shape.root;
    step.src = Buffer::Input;
    step.dst = Buffer::Output;
    for (size_t base = 0; base < parts.size(q); base += chunk) {
      step.srcOffset = step.dstOffset = parts.begin(q) + base;
      step.count = std::min(chunk, parts.size(q) - base);
      addStep(plan, step);
    }
  }
  // All-gather around the ring: send part r, pass on r-1, ..., keep r+1,
  // piece by piece (a part that has no piece at `base` adds no step).
  const Ring ring{n, r, ringIndex(r - 1, n), ringIndex(r + 1, n)};
  size_t largest = 0;
  for (int q = 0; q < n; ++q) largest = std::max(largest, parts.size(q));
  for (size_t base = 0; base < largest; base += chunk)
    addRingAllGather(plan, ring, [&](Step step, int part) {
      const int c = ringIndex(part, n);
      step.src = step.dst = Buffer::Output;
      step.srcOffset = step.dstOffset = parts.begin(c) + base;
      step.count = base < parts.size(c) ? std::min(chunk, parts.size(c) - base) : 0;
      return step;
    });
  return plan;
}

}  // namespace braid::algo
