// The passes around a ring that several planners take: reduce-scatter and
// all-gather, one piece at a time, among any ring of ranks (all of them,
// a host's, or one per host).
#pragma once

#include "algorithms/plan.h"
#include "algorithms/steps.h"

namespace braid::algo {

// A ring of `size` ranks as one of them sees it: its position, the rank it
// receives from and the rank it sends to.
struct Ring {
  int size;
  int me;
  int prev;
  int next;
};

// In the passes below, `piece(step, j)` fills in the buffers, offsets and
// count of ring member j's piece (j is any integer: the callee takes it
// around the ring) and returns the step. The pass has set the step's kind
// and peers, and marks what it passes on as settled; a piece that knows
// better may change the mark. A piece of count 0 adds no step.

// Reduce-scatter: member me-1's piece goes out first; size-2 times the rank
// receives the sum of member me-1-s's piece so far, adds its own and passes
// it on; last it receives the sum of its own piece and adds its own
// (RecvReduceCopy, final with `finalize`). size-1 transfers of a piece.
template <class Piece>
void addRingReduceScatter(Plan& plan, const Ring& ring, bool finalize, Piece piece) {
  for (int s = 0; s <= ring.size - 1; ++s) {
    Step step;
    step.kind = s == 0 ? StepKind::Send
                       : (s < ring.size - 1 ? StepKind::RecvReduceSend : StepKind::RecvReduceCopy);
    step.sendPeer = s < ring.size - 1 ? ring.next : -1;
    step.recvPeer = s > 0 ? ring.prev : -1;
    step.finalize = finalize && s == ring.size - 1;
    addStep(plan, piece(step, ring.me - 1 - s));
  }
}

// All-gather: the rank sends its own piece, then size-2 times receives the
// piece of member me-k, keeps it and passes it on (settled: it is final),
// and last receives the piece of member me+1. size-1 transfers of a piece.
template <class Piece>
void addRingAllGather(Plan& plan, const Ring& ring, Piece piece) {
  Step send;
  send.kind = StepKind::Send;
  send.sendPeer = ring.next;
  addStep(plan, piece(send, ring.me));
  for (int k = 1; k <= ring.size - 1; ++k) {
    const bool last = k == ring.size - 1;
    Step step;
    step.kind = last ? StepKind::Recv : StepKind::RecvCopySend;
    step.recvPeer = ring.prev;
    step.sendPeer = last ? -1 : ring.next;
    step.settled = !last;
    addStep(plan, piece(step, ring.me - k));
  }
}

}  // namespace braid::algo
