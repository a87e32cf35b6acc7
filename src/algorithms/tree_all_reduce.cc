// Double-binary-tree all-reduce (the design NCCL 2.4 introduced).
//
// Two binary trees over the ranks, each carrying half of the buffer: tree 0
// is the heap-ordered tree on ranks 0..n-1 (children of i: 2i+1, 2i+2) with
// root 0; tree 1 is the same tree on the mirrored numbering n-1-r, root
// n-1. A rank that is an inner node of one tree is a leaf (or nearly) of the
// other, so no rank forwards more than about one buffer's worth. Each tree
// first reduces its half towards its root (a node adds its children's data
// to its own and passes the sum up), then broadcasts the result back down,
// chunk by chunk so that the levels of a tree work at the same time. Each
// rank sends and receives about S bytes (half per tree, up and down) and a
// chunk crosses 2 * log2(n) hops: logarithmic latency with close to the
// ring's bandwidth for mid-size buffers.
#include "algorithms/partition.h"
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {
namespace {

// Rank `r`'s place in tree `t` of n ranks.
struct Node {
  int parent = -1;
  int children[2] = {-1, -1};
  int childCount = 0;
};

Node nodeOf(int t, int n, int r) {
  auto rankAt = [&](int i) { return t == 0 ? i : n - 1 - i; };
  const int i = t == 0 ? r : n - 1 - r;
  Node node;
  if (i > 0) node.parent = rankAt((i - 1) / 2);
  for (int c : {2 * i + 1, 2 * i + 2})
    if (c < n) node.children[node.childCount++] = rankAt(c);
  return node;
}

// The reduction of one chunk up tree `node`: children's data added to this
// rank's input, the sum sent to the parent (or kept, at the root).
void reduceUp(Plan& plan, const Node& node, const Span& span) {
  Step step;
  step.srcOffset = step.dstOffset = span.begin;
  step.count = span.count;
  const bool root = node.parent < 0;
  if (node.childCount == 0) {
    if (root) {
      step.kind = StepKind::Copy;
      step.finalize = true;
    } else {
      step.kind = StepKind::Send;
      step.sendPeer = node.parent;
    }
    addStep(plan, step);
    return;
  }
  step.src = Buffer::Input;
  for (int c = 0; c < node.childCount; ++c) {
    step.recvPeer = node.children[c];
    const bool last = c == node.childCount - 1;
    if (last && !root) {
      step.kind = StepKind::RecvReduceSend;
      step.sendPeer = node.parent;
    } else {
      step.kind = StepKind::RecvReduceCopy;
      step.dst = Buffer::Output;
      step.finalize = last;
    }
    addStep(plan, step);
    step.src = Buffer::Output;
  }
}

// The broadcast of one chunk down tree `node` from its root.
void broadcastDown(Plan& plan, const Node& node, const Span& span) {
  Step step;
  step.srcOffset = step.dstOffset = span.begin;
  step.count = span.count;
  step.src = step.dst = Buffer::Output;
  step.settled = true;
  int c = 0;
  if (node.parent >= 0) {
    step.recvPeer = node.parent;
    if (node.childCount > 0) {
      step.kind = StepKind::RecvCopySend;
      step.sendPeer = node.children[c++];
    } else {
      step.kind = StepKind::Recv;
      step.settled = false;
    }
    addStep(plan, step);
  }
  step.recvPeer = -1;
  step.kind = StepKind::Send;
  step.settled = true;
  for (; c < node.childCount; ++c) {
    step.sendPeer = node.children[c];
    addStep(plan, step);
  }
}

}  // namespace

Plan treeAllReduce(const Shape& shape) {
  const int n = shape.nranks;
  const int r = shape.rank;
  Plan plan;
  if (trivialReduction(shape, shape.count, plan)) return plan;
  // Tree 0 carries the first half (chunk-aligned), tree 1 the rest.
  const Parts halves(0, shape.count, 2, shape.alignElems);
  const Node nodes[2] = {nodeOf(0, n, r), nodeOf(1, n, r)};
  // Up both trees, then down both: every rank takes the phases in the same
  // order, so the messages between any two ranks come in the order sent.
  for (bool up : {true, false})
    for (int t = 0; t < 2; ++t)
      for (size_t base = halves.begin(t); base < halves.begin(t) + halves.size(t);
           base += shape.chunkElems) {
        const Span span{base, std::min(shape.chunkElems, halves.begin(t) + halves.size(t) - base)};
        if (up)
          reduceUp(plan, nodes[t], span);
        else
          broadcastDown(plan, nodes[t], span);
      }
  return plan;
}

}  // namespace braid::algo
