// Host reduction kernels: one elementwise loop per (DataType, ReduceOp),
// chosen from a static table. Hot path: no allocation, no lock, and no
// per-element branch on type or op; the only per-call branch picks the loop
// variant for the caller's aliasing (dst == a, dst == b, both, or neither).
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
#include "reduce/reduce.h"

#include <array>
#include <cstring>
#include <type_traits>

#include "reduce/float_convert.h"

namespace braid::reduce {
namespace {

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

// Written as selects rather than branches so the loops vectorize.
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
  static float widen(uint16_t v) { return detail::halfToFloatInline(v); }
  static uint16_t narrow(float f) { return detail::floatToHalfInline(f); }
};
struct BFloat16 {
  using Storage = uint16_t;
  static float widen(uint16_t v) { return detail::bf16ToFloatInline(v); }
  static uint16_t narrow(float f) { return detail::floatToBf16Inline(f); }
};
struct E4M3 {
  using Storage = uint8_t;
  static float widen(uint8_t v) { return detail::fp8e4m3ToFloatInline(v); }
  static uint8_t narrow(float f) { return detail::floatToFp8e4m3Inline(f); }
};
struct E5M2 {
  using Storage = uint8_t;
  static float widen(uint8_t v) { return detail::fp8e5m2ToFloatInline(v); }
  static uint8_t narrow(float f) { return detail::floatToFp8e5m2Inline(f); }
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

// The Kernel for Op. (Signed integer data is read through the unsigned type
// of the same width for Sum and Prod, which the aliasing rules allow.)
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

// ---- The dispatch table, indexed [DataType][ReduceOp]. ----

using KernelRow = std::array<Kernel, kNumReduceOps>;

static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(ReduceOp::Prod) == 1 &&
                  static_cast<int>(ReduceOp::Max) == 2 && static_cast<int>(ReduceOp::Min) == 3 &&
                  static_cast<int>(ReduceOp::Avg) == 4 && kNumReduceOps == 5,
              "KernelRow's column order follows ReduceOp");

template <typename Sum, typename Prod, typename Max, typename Min>
constexpr KernelRow row() {
  return {&elementwise<Sum>, &elementwise<Prod>, &elementwise<Max>, &elementwise<Min>,
          &elementwise<Sum> /* Avg: finalize() divides */};
}

template <typename T>
constexpr KernelRow integerRow() {
  using U = std::make_unsigned_t<T>;
  return row<WrapSum<U>, WrapProd<U>, IntMax<T>, IntMin<T>>();
}

template <typename F>
constexpr KernelRow floatRow() {
  return row<FloatSum<F>, FloatProd<F>, FloatMax<F>, FloatMin<F>>();
}

template <typename Format>
constexpr KernelRow narrowRow() {
  return row<Narrowed<Format, FloatSum>, Narrowed<Format, FloatProd>, Narrowed<Format, FloatMax>,
             Narrowed<Format, FloatMin>>();
}

static_assert(
    static_cast<int>(DataType::Int8) == 0 && static_cast<int>(DataType::Uint8) == 1 &&
        static_cast<int>(DataType::Int32) == 2 && static_cast<int>(DataType::Uint32) == 3 &&
        static_cast<int>(DataType::Int64) == 4 && static_cast<int>(DataType::Uint64) == 5 &&
        static_cast<int>(DataType::Float16) == 6 && static_cast<int>(DataType::Float32) == 7 &&
        static_cast<int>(DataType::Float64) == 8 && static_cast<int>(DataType::BFloat16) == 9 &&
        static_cast<int>(DataType::Float8E4M3) == 10 &&
        static_cast<int>(DataType::Float8E5M2) == 11 && kNumDataTypes == 12,
    "kKernels' row order follows DataType");

constexpr std::array<KernelRow, kNumDataTypes> kKernels = {
    integerRow<int8_t>(),  integerRow<uint8_t>(),  integerRow<int32_t>(), integerRow<uint32_t>(),
    integerRow<int64_t>(), integerRow<uint64_t>(), narrowRow<Half>(),     floatRow<float>(),
    floatRow<double>(),    narrowRow<BFloat16>(),  narrowRow<E4M3>(),     narrowRow<E5M2>(),
};

// ---- finalize() for Avg ----

// C++ `/` on the element's own type (after the usual promotions), which
// truncates toward zero. The divisor is at least 2 here.
template <typename T>
void divideIntegers(void* dst, size_t count, int divisor) {
  T* d = static_cast<T*>(dst);
  const auto div = static_cast<std::common_type_t<T, int>>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / div);
}

template <typename F>
void divideFloats(void* dst, size_t count, int divisor) {
  F* d = static_cast<F*>(dst);
  const F div = static_cast<F>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = d[i] / div;
}

template <typename Format>
void divideNarrow(void* dst, size_t count, int divisor) {
  using T = typename Format::Storage;
  T* d = static_cast<T*>(dst);
  const float div = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = Format::narrow(Format::widen(d[i]) / div);
}

}  // namespace

Kernel kernelFor(DataType type, ReduceOp op) {
  const int t = static_cast<int>(type);
  const int o = static_cast<int>(op);
  if (t < 0 || t >= kNumDataTypes || o < 0 || o >= kNumReduceOps) return nullptr;
  return kKernels[t][o];
}

void finalize(void* dst, size_t count, DataType type, ReduceOp op, int divisor) {
  // Dividing by 1 changes nothing; a divisor below 1 is a caller bug that we
  // refuse to turn into a division by zero.
  if (op != ReduceOp::Avg || divisor <= 1) return;
  switch (type) {
    case DataType::Int8:
      return divideIntegers<int8_t>(dst, count, divisor);
    case DataType::Uint8:
      return divideIntegers<uint8_t>(dst, count, divisor);
    case DataType::Int32:
      return divideIntegers<int32_t>(dst, count, divisor);
    case DataType::Uint32:
      return divideIntegers<uint32_t>(dst, count, divisor);
    case DataType::Int64:
      return divideIntegers<int64_t>(dst, count, divisor);
    case DataType::Uint64:
      return divideIntegers<uint64_t>(dst, count, divisor);
    case DataType::Float16:
      return divideNarrow<Half>(dst, count, divisor);
    case DataType::Float32:
      return divideFloats<float>(dst, count, divisor);
    case DataType::Float64:
      return divideFloats<double>(dst, count, divisor);
    case DataType::BFloat16:
      return divideNarrow<BFloat16>(dst, count, divisor);
    case DataType::Float8E4M3:
      return divideNarrow<E4M3>(dst, count, divisor);
    case DataType::Float8E5M2:
      return divideNarrow<E5M2>(dst, count, divisor);
  }
}

}  // namespace braid::reduce
