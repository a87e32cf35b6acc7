// Appending steps to a plan, for the planners: single steps, chunked
// exchanges with a partner, the reductions that need no algorithm, the
// fold onto a power of two, a link of a chain.
#pragma once

#include <algorithm>
#include <cstddef>

#include "algorithms/partition.h"
#include "algorithms/plan.h"

namespace braid::algo {

// Appends `step` unless it moves nothing: both ends of a transfer compute
// the same sizes, so both skip it.
inline void addStep(Plan& plan, const Step& step) {
  if (step.count > 0) plan.steps.push_back(step);
}

// A local copy of `count` elements, from Input to Output unless the caller
// changes src or dst.
inline Step localCopy(size_t srcOffset, size_t dstOffset, size_t count, bool finalize) {
  Step step;
  step.kind = StepKind::Copy;
  step.srcOffset = srcOffset;
  step.dstOffset = dstOffset;
  step.count = count;
  step.finalize = finalize;
  return step;
}

// An element range [begin, begin + count) of some buffer.
struct Span {
  size_t begin;
  size_t count;
};

// Appends one exchange, chunked so that no step holds more than `chunk`
// elements, alternating sends and receives so that no FIFO fills: send
// `out` of `from` to `sendPeer`, receive `in` from `recvPeer` with step
// `recv` (whose kind, src, dst and flags are kept; offsets and count are set
// per chunk: src at the chunk's place in `in`, dst there too, or from
// `dstBegin` on when given).
inline constexpr size_t kSameAsIn = ~size_t{0};
inline void addExchange(Plan& plan, int sendPeer, const Span& out, Buffer from, int recvPeer,
                        const Span& in, Step recv, size_t chunk, bool settledOut = false,
                        size_t dstBegin = kSameAsIn) {
  const size_t outChunks = (out.count + chunk - 1) / chunk;
  const size_t inChunks = (in.count + chunk - 1) / chunk;
  for (size_t i = 0; i < std::max(outChunks, inChunks); ++i) {
    if (i < outChunks) {
      Step send;
      send.kind = StepKind::Send;
      send.sendPeer = sendPeer;
      send.src = from;
      send.srcOffset = out.begin + i * chunk;
      send.count = std::min(chunk, out.count - i * chunk);
      send.settled = settledOut;
      addStep(plan, send);
    }
    if (i < inChunks) {
      Step step = recv;
      step.recvPeer = recvPeer;
      step.srcOffset = in.begin + i * chunk;
      step.dstOffset = (dstBegin == kSameAsIn ? in.begin : dstBegin) + i * chunk;
      step.count = std::min(chunk, in.count - i * chunk);
      addStep(plan, step);
    }
  }
}

// The whole plan of a reduction in the cases that need no algorithm:
// nothing for an empty buffer, one finalizing copy on a single rank.
// Returns true when `plan` is complete.
inline bool trivialReduction(const Shape& shape, size_t count, Plan& plan) {
  if (count > 0 && shape.nranks == 1) addStep(plan, localCopy(0, 0, count, /*finalize=*/true));
  return count == 0 || shape.nranks == 1;
}

// Fold's first step for `whole`: 2i sends its input to 2i+1, which adds it
// into its output. Returns where this rank's partial result now is.
inline Buffer addFoldIn(Plan& plan, const Fold& fold, int r, const Span& whole, size_t chunk) {
  if (fold.handsOn(r)) {
    addExchange(plan, r + 1, whole, Buffer::Input, r + 1, {0, 0}, Step{}, chunk);
  } else if (fold.takesOver(r)) {
    Step add;
    add.kind = StepKind::RecvReduceCopy;
    add.src = Buffer::Input;
    add.dst = Buffer::Output;
    addExchange(plan, r - 1, {0, 0}, Buffer::Input, r - 1, whole, add, chunk);
    return Buffer::Output;
  }
  return Buffer::Input;
}

// Fold's last step: 2i+1 hands the finished `whole` back to 2i.
inline void addFoldOut(Plan& plan, const Fold& fold, int r, const Span& whole, size_t chunk) {
  if (fold.takesOver(r)) {
    addExchange(plan, r - 1, whole, Buffer::Output, r - 1, {0, 0}, Step{}, chunk,
                /*settledOut=*/true);
  } else if (fold.handsOn(r)) {
    Step get;
    get.kind = StepKind::Recv;
    get.dst = Buffer::Output;
    addExchange(plan, r + 1, {0, 0}, Buffer::Output, r + 1, whole, get, chunk);
  }
}

// The step of the rank at `position` in a chain of `length` ranks that
// passes each piece from position 0 on (receiving from `prev`, sending to
// `next`): the first sends, the middle ones `pass` it on (a kind that
// receives and sends), the last `end`s it (a kind that only receives).
// Kind and peers only: the caller adds what the step moves.
inline Step chainLink(int position, int length, int prev, int next, StepKind pass, StepKind end) {
  Step step;
  if (position == 0) {
    step.kind = StepKind::Send;
    step.sendPeer = next;
  } else if (position < length - 1) {
    step.kind = pass;
    step.recvPeer = prev;
    step.sendPeer = next;
  } else {
    step.kind = end;
    step.recvPeer = prev;
  }
  return step;
}

}  // namespace braid::algo
