// The element operations of every (DataType, ReduceOp) and the loop that
// applies one over a buffer, shared by every ISA level (dispatch.h).
//
// These define the results: the scalar kernels are exactly these loops, the
// AVX2 and AVX-512 kernels compile the same loops for a wider target or
// replace them with intrinsics that must produce the same bits.
//
// Semantics (the doc comments in types.h and reduce.h state the contract):
// - Integer Sum and Prod run on the unsigned type of the same width, so they
//   wrap modulo 2^bits with no signed-overflow UB; Max and Min compare the
//   declared (signed or unsigned) type.
// - Floating-point Max and Min follow IEEE 754-2019 maximum/minimum: a NaN
//   operand gives NaN, and -0 orders below +0, so only which NaN comes back
//   can depend on operand order.
// - fp16, bf16 and fp8 widen both operands to fp32, combine, and round once
//   back to the narrow type (nearest even). fp32's 24-bit significand is at
//   least 2p + 2 for each narrow precision p, so this equals rounding the
//   exact result directly. The conversions (float_convert.h) are written so
//   that these loops vectorize too, with plain SSE2.
// - Avg combines like Sum; finalize() divides by the number of ranks.
//
// Nothing here carries a target attribute: inlined into a function that has
// one (the AVX kernels), the loops are vectorized for that target, and any
// out-of-line copy is baseline code, safe on every x86-64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "reduce/float_convert.h"

namespace braid::reduce::detail {

// ---- Element operations. Each names the type it reads and writes. ----

// Unsigned arithmetic wide enough that uint8_t does not promote to int (and
// so cannot overflow a signed type).
template <typename U>
using UnsignedArith = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;

template <typename U>
struct WrapSum {
  using Storage = U;
  static U apply(U a, U b) {
    return static_cast<U>(static_cast<UnsignedArith<U>>(a) + static_cast<UnsignedArith<U>>(b));
  }
};

template <typename U>
struct WrapProd {
  using Storage = U;
  static U apply(U a, U b) {
    return static_cast<U>(static_cast<UnsignedArith<U>>(a) * static_cast<UnsignedArith<U>>(b));
  }
};

template <typename T>
struct IntMax {
  using Storage = T;
  static T apply(T a, T b) { return a < b ? b : a; }
};

template <typename T>
struct IntMin {
  using Storage = T;
  static T apply(T a, T b) { return b < a ? b : a; }
};

template <typename F>
struct FloatSum {
  using Storage = F;
  static F apply(F a, F b) { return a + b; }
};

template <typename F>
struct FloatProd {
  using Storage = F;
  static F apply(F a, F b) { return a * b; }
};

// Equal operands are either identical or zeros of either sign; for those,
// ANDing the bit patterns picks +0 over -0 and ORing picks -0 over +0.
template <typename F>
using FloatBits = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;

template <typename F>
F combineBits(F a, F b, bool useAnd) {
  FloatBits<F> x;
  FloatBits<F> y;
  std::memcpy(&x, &a, sizeof a);
  std::memcpy(&y, &b, sizeof b);
  const FloatBits<F> z = useAnd ? (x & y) : (x | y);
  F r;
  std::memcpy(&r, &z, sizeof r);
  return r;
}

// Written as selects rather than branches so the loops vectorize. Which NaN
// comes back: a when a is NaN, else b.
template <typename F>
struct FloatMax {
  using Storage = F;
  static F apply(F a, F b) {
    const F larger = a > b ? a : b;  // b when equal or unordered
    const F r = a == b ? combineBits(a, b, /*useAnd=*/true) : larger;
    return a != a ? a : r;  // a NaN; a NaN in b already came through as `larger`
  }
};

template <typename F>
struct FloatMin {
  using Storage = F;
  static F apply(F a, F b) {
    const F smaller = a < b ? a : b;
    const F r = a == b ? combineBits(a, b, /*useAnd=*/false) : smaller;
    return a != a ? a : r;
  }
};

// A narrow float type: its storage and its conversions to and from fp32.
struct Half {
  using Storage = uint16_t;
  static float widen(uint16_t v) { return halfToFloatInline(v); }
  static uint16_t narrow(float f) { return floatToHalfInline(f); }
};
struct BFloat16 {
  using Storage = uint16_t;
  static float widen(uint16_t v) { return bf16ToFloatInline(v); }
  static uint16_t narrow(float f) { return floatToBf16Inline(f); }
};
struct E4M3 {
  using Storage = uint8_t;
  static float widen(uint8_t v) { return fp8e4m3ToFloatInline(v); }
  static uint8_t narrow(float f) { return floatToFp8e4m3Inline(f); }
};
struct E5M2 {
  using Storage = uint8_t;
  static float widen(uint8_t v) { return fp8e5m2ToFloatInline(v); }
  static uint8_t narrow(float f) { return floatToFp8e5m2Inline(f); }
};

// Widen, combine in fp32 with FloatOp, round back once.
template <typename Format, template <typename> class FloatOp>
struct Narrowed {
  using Storage = typename Format::Storage;
  static Storage apply(Storage a, Storage b) {
    return Format::narrow(FloatOp<float>::apply(Format::widen(a), Format::widen(b)));
  }
};

// ---- Loops. One per aliasing case so every pointer can be __restrict. ----

template <typename Op, typename T = typename Op::Storage>
void applyDistinct(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename Op, typename T = typename Op::Storage>
void applyIntoFirst(T* __restrict dst, const T* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Op::apply(dst[i], b[i]);
}

template <typename Op, typename T = typename Op::Storage>
void applyIntoSecond(T* __restrict dst, const T* __restrict a, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Op::apply(a[i], dst[i]);
}

template <typename Op, typename T = typename Op::Storage>
void applySelf(T* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Op::apply(dst[i], dst[i]);
}

// dst = a Op b over `count` elements; the only branch picks the loop for the
// caller's aliasing (dst == a, dst == b, both, or neither). Signed integer
// data is read through the unsigned type of the same width for Sum and Prod,
// which the aliasing rules allow.
template <typename Op>
void elementwise(void* dst, const void* a, const void* b, size_t count) {
  using T = typename Op::Storage;
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (d == x && d == y) {
    applySelf<Op>(d, count);
  } else if (d == x) {
    applyIntoFirst<Op>(d, y, count);
  } else if (d == y) {
    applyIntoSecond<Op>(d, x, count);
  } else {
    applyDistinct<Op>(d, x, y, count);
  }
}

}  // namespace braid::reduce::detail
