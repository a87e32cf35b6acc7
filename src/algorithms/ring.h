// Chunk and rank arithmetic shared by the planners.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "algorithms/plan.h"

namespace braid::algo {

inline int ringIndex(long long i, int n) { return static_cast<int>(((i % n) + n) % n); }

// One round of a ring collective covers `length` elements split into n
// chunks of equal, aligned size; the last chunks may be short or empty.
struct RingRound {
  size_t base;
  size_t length;
  size_t chunk;

  RingRound(size_t base, size_t length, int n, size_t align) : base(base), length(length) {
    size_t even = (length + n - 1) / n;
    chunk = (even + align - 1) / align * align;
  }
  size_t begin(int c) const { return std::min(c * chunk, length); }
  size_t size(int c) const { return std::min(begin(c) + chunk, length) - begin(c); }
  size_t offset(int c) const { return base + begin(c); }
};

// Appends `step` unless it moves nothing: both ends of a transfer compute
// the same sizes, so both skip it.
inline void addStep(Plan& plan, const Step& step) {
  if (step.count > 0) plan.steps.push_back(step);
}

// The largest power of two not above n (n >= 1).
inline int powerOfTwoBelow(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
inline bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Ranks folded onto a power of two, for recursive doubling and halving at
// any rank count: with p = powerOfTwoBelow(n) and e = n - p, ranks 0..2e-1
// pair up (2i hands its data to 2i+1), leaving p active ranks numbered
// 0..p-1.
struct Fold {
  int p, e;
  explicit Fold(int n) : p(powerOfTwoBelow(n)), e(n - powerOfTwoBelow(n)) {}
  // The active number of rank r, or -1 for a rank that handed its data on.
  int active(int r) const { return r < 2 * e ? (r % 2 ? r / 2 : -1) : r - e; }
  int rankOf(int active) const { return active < e ? 2 * active + 1 : active + e; }
  bool handsOn(int r) const { return r < 2 * e && r % 2 == 0; }    // 2i
  bool takesOver(int r) const { return r < 2 * e && r % 2 == 1; }  // 2i+1
};

// Ranks numbered host by host (Shape::localRanks = L per host, H hosts):
// host h holds ranks h*L .. h*L + L-1, and rank r is local rank r % L of
// host r / L.
struct Hosts {
  int L, H, host, local;
  explicit Hosts(const Shape& shape)
      : L(shape.localRanks),
        H(shape.nranks / shape.localRanks),
        host(shape.rank / shape.localRanks),
        local(shape.rank % shape.localRanks) {}
  // The rank of local rank `l` on host `h`, both taken around their rings.
  int rankOf(int h, int l) const { return ringIndex(h, H) * L + ringIndex(l, L); }
};

// A rank's place in the binomial tree of n ranks rooted at `root`: in ranks
// relative to the root, v's parent is v - lowbit(v) and its children are
// v + 2^k for every 2^k below lowbit(v) (for the root: below n), here
// smallest subtree first.
struct BinomialNode {
  int parent = -1;  // -1 at the root
  std::vector<int> children;
  BinomialNode(int n, int r, int root) {
    const int v = ringIndex(r - root, n);
    const int low = v == 0 ? powerOfTwoBelow(n) * 2 : (v & -v);
    for (int k = 1; k < low; k *= 2)
      if (v + k < n) children.push_back(ringIndex(v + k + root, n));
    if (v != 0) parent = ringIndex(v - low + root, n);
  }
};

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

inline Step localCopy(size_t srcOffset, size_t dstOffset, size_t count, bool finalize);

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

inline Step localCopy(size_t srcOffset, size_t dstOffset, size_t count, bool finalize) {
  Step step;
  step.kind = StepKind::Copy;
  step.srcOffset = srcOffset;
  step.dstOffset = dstOffset;
  step.count = count;
  step.finalize = finalize;
  return step;
}

}  // namespace braid::algo
