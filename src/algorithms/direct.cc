// Direct algorithms, for buffers every rank maps at the same offsets
// (Shape::mapped: device buffers in a registered window). The data moves
// by loads and stores into peers' buffers; Signals (empty messages through
// the connections) order the ranks:
//
// - "arrived": every rank's input is ready (its stream reached the op), so
//   peers may read it;
// - "done": no peer reads this rank's buffers or writes into them any more,
//   so the stream may go on to what the user does with them next.
//
// A round of Signals goes to r+1, r+2, ..., r-1 and comes from r-1, ...,
// r+1 in the same steps; the executor posts a round's messages before it
// waits for any of them.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {
namespace {

void signalAll(Plan& plan, const Shape& shape) {
  const int n = shape.nranks, r = shape.rank;
  plan.mapped = true;
  for (int k = 1; k < n; ++k) {
    Step signal;
    signal.kind = StepKind::Signal;
    signal.sendPeer = ringIndex(r + k, n);
    signal.recvPeer = ringIndex(r - k, n);
    plan.steps.push_back(signal);
  }
}

}  // namespace

// One-shot: arrived; out = in_0 op in_1 op ... op in_{n-1}, read where they
// are, in one kernel (into scratch first when the output is where a peer
// may still be reading this rank's input: it is copied out once every
// rank is done); done. Each rank reads (n-1) * S bytes from its peers, and
// the result is bitwise the same everywhere. REQUIRES: shape.mapped,
// nranks <= kMaxDirectRanks.
Plan oneShotMappedAllReduce(const Shape& shape) {
  Plan plan;
  if (shape.count == 0) return plan;
  signalAll(plan, shape);
  Step reduce;
  reduce.kind = StepKind::ReduceFrom;
  reduce.src = Buffer::Input;
  reduce.dst = Buffer::Scratch;  // the output may be the input
  reduce.count = shape.count;
  reduce.finalize = true;
  plan.steps.push_back(reduce);
  plan.scratchBytes = shape.count * shape.elemSize;
  signalAll(plan, shape);
  Step out = localCopy(0, 0, shape.count, /*finalize=*/false);
  out.src = Buffer::Scratch;
  plan.steps.push_back(out);
  return plan;
}

// Two-shot: arrived; rank r reduces part r of every rank's input into its
// output (a reduce-scatter by direct reads, in rank order); every part
// reduced; it writes that part into every other rank's output (an
// all-gather by direct writes); done. Each rank reads (n-1)/n * S bytes
// from its peers and writes as much into them; every part is combined in
// rank order, so the result is bitwise one-shot's. REQUIRES: shape.mapped,
// nranks <= kMaxDirectRanks.
Plan twoShotAllReduce(const Shape& shape) {
  const int n = shape.nranks, r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  const Parts parts(0, shape.count, n, shape.alignElems);
  signalAll(plan, shape);
  // Part r of every input, reduced into part r of this rank's output
  // (where the output is the input, only this rank reads that part).
  if (parts.size(r) > 0) {
    Step reduce;
    reduce.kind = StepKind::ReduceFrom;
    reduce.src = Buffer::Input;
    reduce.dst = Buffer::Output;
    reduce.srcOffset = reduce.dstOffset = parts.offset(r);
    reduce.count = parts.size(r);
    reduce.finalize = true;
    plan.steps.push_back(reduce);
  }
  signalAll(plan, shape);  // every part reduced, and every input read
  for (int k = 1; k < n && parts.size(r) > 0; ++k) {
    Step put;
    put.kind = StepKind::CopyTo;
    put.sendPeer = ringIndex(r + k, n);
    put.src = put.dst = Buffer::Output;
    put.srcOffset = put.dstOffset = parts.offset(r);
    put.count = parts.size(r);
    plan.steps.push_back(put);
  }
  signalAll(plan, shape);  // every part written everywhere
  return plan;
}

// Each rank writes its input into part r of every output (its own too
// unless in place), between arrived (outputs free: the peers' streams
// reached the op) and done: (n-1) * S bytes written into peers per rank.
// REQUIRES: shape.mapped.
Plan oneShotAllGather(const Shape& shape) {
  const int n = shape.nranks, r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  signalAll(plan, shape);
  for (int k = 1; k < n; ++k) {
    Step put;
    put.kind = StepKind::CopyTo;
    put.sendPeer = ringIndex(r + k, n);
    put.src = Buffer::Input;
    put.dst = Buffer::Output;
    put.dstOffset = static_cast<size_t>(r) * shape.count;
    put.count = shape.count;
    plan.steps.push_back(put);
  }
  plan.steps.push_back(localCopy(0, static_cast<size_t>(r) * shape.count, shape.count, false));
  signalAll(plan, shape);
  return plan;
}

// The root first puts its input into its output (when they differ); the
// others read the root's output once it arrived: S bytes each.
// REQUIRES: shape.mapped.
Plan oneShotBroadcast(const Shape& shape) {
  const int r = shape.rank;
  Plan plan;
  if (shape.count == 0) return plan;
  if (r == shape.root) plan.steps.push_back(localCopy(0, 0, shape.count, false));
  signalAll(plan, shape);
  if (r != shape.root) {
    Step get;
    get.kind = StepKind::CopyFrom;
    get.recvPeer = shape.root;
    get.src = get.dst = Buffer::Output;
    get.count = shape.count;
    plan.steps.push_back(get);
  }
  signalAll(plan, shape);
  return plan;
}

}  // namespace braid::algo
