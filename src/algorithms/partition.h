// How the planners cut ranks and buffers: positions on a ring, a buffer's
// aligned parts, powers of two and the fold onto one, recursive halving's
// ranges, hosts, binomial trees. Arithmetic only: nothing here makes a step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "algorithms/plan.h"

namespace braid::algo {

// i taken around a ring of n: 0 <= ringIndex(i, n) < n, also for i < 0.
inline int ringIndex(long long i, int n) { return static_cast<int>(((i % n) + n) % n); }

// `length` elements from `base` cut into n parts of equal, aligned size;
// the last parts may be short or empty.
struct Parts {
  size_t base;
  size_t length;
  size_t chunk;  // the size of a full part

  Parts(size_t base, size_t length, int n, size_t align) : base(base), length(length) {
    size_t even = (length + n - 1) / n;
    chunk = (even + align - 1) / align * align;
  }
  // Part c's first element relative to base, its size, and its first
  // element in the buffer.
  size_t begin(int c) const { return std::min(c * chunk, length); }
  size_t size(int c) const { return std::min(begin(c) + chunk, length) - begin(c); }
  size_t offset(int c) const { return base + begin(c); }
};

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

// One step of recursive halving over p parts (p a power of two), as the
// rank at position a takes it: with the rank at a ^ mask it keeps the half
// of its current range of parts that holds part a and gives the other half.
struct HalvingStep {
  int mask;
  int keep;   // the kept half's first part
  int give;   // the given half's first part
  int parts;  // parts in each half
};

// The steps for mask = p/2, p/4, ..., 1: after them position a keeps part
// a alone.
inline std::vector<HalvingStep> halvingSteps(int p, int a) {
  std::vector<HalvingStep> steps;
  int lo = 0, size = p;  // the range of parts a still holds
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    size /= 2;
    const bool upper = (a & mask) != 0;
    steps.push_back({mask, upper ? lo + size : lo, upper ? lo : lo + size, size});
    if (upper) lo += size;
  }
  return steps;
}

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

}  // namespace braid::algo
