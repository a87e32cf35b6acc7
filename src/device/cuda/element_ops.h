// The element functions of the CUDA reduce kernels (kernels.cu): for every
// DataType x ReduceOp, how one element of the result is made from the
// inputs. Every function is __host__ __device__, so that g++ compiles this
// header too and the tests compare it with the host kernels on the CPU.
//
// The results are bit for bit those of braid's host kernels
// (reduce::kernelFor and reduce::finalize; src/reduce/elementwise.h states
// the semantics), reached without the host headers, which use std::memcpy
// and are not device code:
// - Integer Sum and Prod wrap (unsigned arithmetic); Max and Min compare the
//   declared type; Avg's divide is C++ `/`, truncating toward zero.
// - Floating-point Max and Min are IEEE 754-2019 maximum and minimum: a NaN
//   operand comes back unchanged (the first one when both are NaN), and -0
//   orders below +0. They are computed on the bit patterns, so no flush-to-
//   zero mode can touch them.
// - Floating-point Sum, Prod and Avg's divide are IEEE operations rounded to
//   nearest even with subnormals kept (on the device: explicit PTX, which
//   neither -ftz=true nor --use_fast_math nor FMA contraction changes).
//   A NaN result follows the host CPU's rules, not the GPU's (a GPU always
//   returns the canonical NaN 0x7fffffff): a NaN operand comes back quieted,
//   with its sign and payload; an invalid operation such as inf - inf or
//   0 * inf gives the CPU's default NaN (x86: negative, 0xffc00000;
//   elsewhere positive, 0x7fc00000). Of two NaN operands the host kernels
//   may return either one's (reduce.h); as built (GCC, every ISA level)
//   they return the second's, b in a op b, and so does this code: in a
//   fold, the latest NaN input wins.
// - fp16, bf16 and fp8 widen to fp32 exactly and round back to nearest
//   even, subnormals included; a NaN narrows to a quiet NaN with the input's
//   sign (fp16 and bf16 keep the top payload bits); fp16 and bf16 overflow
//   to infinity, fp8 saturates to the largest finite value of the same sign
//   (E5M2 keeps an infinite input infinite; E4M3 has no infinity).
//
// n inputs: an accumulator in the accumulation type (fp32 for the narrow
// floats, the type itself otherwise) folds the inputs left to right,
// acc = op(acc, x_i), and is rounded to the storage type once at the end.
// For two inputs that is exactly the host kernel; one input is a bit copy.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "braid/types.h"
#include "device/device.h"

#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif

// Unrolls the following loop in device code (g++ does not know the pragma).
#if defined(__CUDA_ARCH__)
#define BRAID_UNROLL _Pragma("unroll")
#else
#define BRAID_UNROLL
#endif

namespace braid::device::cuda {

// ---- Bit casts ----

BRAID_HD inline uint32_t bitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

BRAID_HD inline float floatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

BRAID_HD inline uint64_t bitsOf(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

BRAID_HD inline double doubleFromBits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// ---- The bit layout of fp32 and fp64 ----

template <typename F>
struct FloatLayout;

template <>
struct FloatLayout<float> {
  using Bits = uint32_t;
  static constexpr Bits kSign = 0x80000000u;
  static constexpr Bits kInf = 0x7f800000u;
  static constexpr Bits kQuiet = 0x00400000u;
#if defined(__x86_64__) || defined(__i386__)
  static constexpr Bits kDefaultNaN = 0xffc00000u;  // SSE's "real indefinite"
#else
  static constexpr Bits kDefaultNaN = 0x7fc00000u;
#endif
  BRAID_HD static Bits bits(float f) { return bitsOf(f); }
  BRAID_HD static float fromBits(Bits u) { return floatFromBits(u); }
};

template <>
struct FloatLayout<double> {
  using Bits = uint64_t;
  static constexpr Bits kSign = 0x8000000000000000ull;
  static constexpr Bits kInf = 0x7ff0000000000000ull;
  static constexpr Bits kQuiet = 0x0008000000000000ull;
#if defined(__x86_64__) || defined(__i386__)
  static constexpr Bits kDefaultNaN = 0xfff8000000000000ull;
#else
  static constexpr Bits kDefaultNaN = 0x7ff8000000000000ull;
#endif
  BRAID_HD static Bits bits(double d) { return bitsOf(d); }
  BRAID_HD static double fromBits(Bits u) { return doubleFromBits(u); }
};

template <typename F>
BRAID_HD inline bool isNaN(F f) {
  using L = FloatLayout<F>;
  return (L::bits(f) & ~L::kSign) > L::kInf;
}

// ---- IEEE arithmetic, rounded to nearest even, subnormals kept ----

// The bare operations. On the device, explicit PTX: the compiler's own
// float operations follow -ftz and may be fused into FMAs.
BRAID_HD inline float rawAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a + b;
#endif
}

BRAID_HD inline float rawMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a * b;
#endif
}

BRAID_HD inline float rawDiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a / b;
#endif
}

BRAID_HD inline double rawAdd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);  // fp64 has no flush-to-zero mode; this is never fused
#else
  return a + b;
#endif
}

BRAID_HD inline double rawMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

BRAID_HD inline double rawDiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// The NaN the host kernels return for an operation on a and b whose result
// r is NaN: a NaN operand, quieted (b's when both are), else the default
// NaN. Any other r comes back unchanged.
template <typename F>
BRAID_HD inline F hostNaNRule(F r, F a, F b) {
  using L = FloatLayout<F>;
  if (!isNaN(r)) return r;
  if (isNaN(b)) return L::fromBits(L::bits(b) | L::kQuiet);
  if (isNaN(a)) return L::fromBits(L::bits(a) | L::kQuiet);
  return L::fromBits(L::kDefaultNaN);
}

template <typename F>
BRAID_HD inline F add(F a, F b) {
  return hostNaNRule(rawAdd(a, b), a, b);
}

template <typename F>
BRAID_HD inline F mul(F a, F b) {
  return hostNaNRule(rawMul(a, b), a, b);
}

template <typename F>
BRAID_HD inline F div(F a, F b) {
  return hostNaNRule(rawDiv(a, b), a, b);
}

// IEEE 754-2019 maximum and minimum on the bit patterns. orderKey maps a
// non-NaN value to an unsigned integer in the order of the values, with -0
// just below +0.
template <typename F>
BRAID_HD inline typename FloatLayout<F>::Bits orderKey(F f) {
  using L = FloatLayout<F>;
  const typename L::Bits u = L::bits(f);
  return (u & L::kSign) != 0 ? static_cast<typename L::Bits>(~u) : (u | L::kSign);
}

template <typename F>
BRAID_HD inline F maximum(F a, F b) {
  if (isNaN(a)) return a;
  if (isNaN(b)) return b;
  return orderKey(a) < orderKey(b) ? b : a;
}

template <typename F>
BRAID_HD inline F minimum(F a, F b) {
  if (isNaN(a)) return a;
  if (isNaN(b)) return b;
  return orderKey(b) < orderKey(a) ? b : a;
}

// ---- Narrow floating-point formats <-> fp32, in integer arithmetic ----
//
// Each format is sign | exponent field | kFracBits fraction bits, with the
// implicit leading one, bias kBias and subnormals at exponent field 0. The
// magnitude code of a value is its bits without the sign.

// The fp32 bits of the finite non-negative value with magnitude code `mag`.
// Every such value is a normal fp32.
template <int kFracBits, int kBias>
BRAID_HD inline uint32_t widenMagnitude(uint32_t mag) {
  if ((mag >> kFracBits) != 0) {  // normal: move the fields, rebias the exponent
    return (mag << (23 - kFracBits)) + (static_cast<uint32_t>(127 - kBias) << 23);
  }
  if (mag == 0) return 0;
  // Subnormal: mag * 2^(1 - kBias - kFracBits). mag converts to fp32
  // exactly; scaling it is an integer subtraction from its exponent field.
  constexpr uint32_t kScale = static_cast<uint32_t>(kBias + kFracBits - 1) << 23;
  return bitsOf(static_cast<float>(mag)) - kScale;
}

// Rounds the non-negative fp32 magnitude `abs` (bits at most those of
// infinity) to nearest even in the format, returning the magnitude code.
// The code is not clamped: a value too large for the format, or infinity,
// gives a code above the largest finite one (callers saturate or go to
// infinity). REQUIRES: the format's exponent range is narrower than fp32's.
template <int kFracBits, int kBias>
BRAID_HD inline uint32_t narrowMagnitude(uint32_t abs) {
  constexpr int kDrop = 23 - kFracBits;                 // fraction bits that round away
  constexpr uint32_t kMinNormalExponent = 128 - kBias;  // fp32 exponent field of 2^(1 - kBias)
  const uint32_t exponent = abs >> 23;
  if (exponent >= kMinNormalExponent) {
    // Normal in the format: rebias, then round the low kDrop bits to
    // nearest even; a carry out of the fraction bumps the exponent.
    const uint32_t rebased = abs - (static_cast<uint32_t>(127 - kBias) << 23);
    const uint32_t kept = rebased >> kDrop;
    const uint32_t dropped = rebased & ((1u << kDrop) - 1u);
    const uint32_t half = 1u << (kDrop - 1);
    return kept + ((dropped > half || (dropped == half && (kept & 1u) != 0)) ? 1u : 0u);
  }
  // Subnormal in the format (or zero): the significand with its leading one,
  // counted in units of the smallest subnormal 2^(1 - kBias - kFracBits),
  // is significand >> shift. fp32 subnormals (exponent field 0) are far
  // below half that unit and round to zero, as do shifts past 24.
  if (exponent == 0) return 0;
  const uint32_t shift = static_cast<uint32_t>(151 - kBias - kFracBits) - exponent;
  if (shift > 24) return 0;
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  // kept == 1 << kFracBits is the smallest normal, encoded correctly.
  return kept + ((dropped > half || (dropped == half && (kept & 1u) != 0)) ? 1u : 0u);
}

constexpr uint32_t kFloatSignBit = 0x80000000u;
constexpr uint32_t kFloatInfBits = 0x7f800000u;
constexpr uint32_t kFloatQuietBit = 0x00400000u;

// IEEE binary16.
BRAID_HD inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7fffu;
  const uint32_t frac = h & 0x3ffu;
  if (mag >= 0x7c00u) {  // inf, or NaN with its payload kept and the quiet bit set
    return floatFromBits(sign | kFloatInfBits | (frac << 13) | (frac != 0 ? kFloatQuietBit : 0u));
  }
  return floatFromBits(sign | widenMagnitude<10, 15>(mag));
}

BRAID_HD inline uint16_t floatToHalf(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & ~kFloatSignBit;
  if (abs > kFloatInfBits) {  // quiet NaN with the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x1ffu));
  }
  const uint32_t code = narrowMagnitude<10, 15>(abs);
  return static_cast<uint16_t>(sign | (code < 0x7c00u ? code : 0x7c00u));  // overflow: inf
}

// bfloat16: the top half of an fp32, same exponent range.
BRAID_HD inline float bf16ToFloat(uint16_t h) {
  return floatFromBits(static_cast<uint32_t>(h) << 16);
}

BRAID_HD inline uint16_t floatToBf16(float f) {
  const uint32_t u = bitsOf(f);
  if ((u & ~kFloatSignBit) > kFloatInfBits) {  // quiet NaN with the top payload bits
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Nearest even; a carry out of the fraction bumps the exponent, up to inf.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// OCP FP8 E4M3: no infinities, S.1111.111 is the only NaN, 448 the largest.
BRAID_HD inline float fp8e4m3ToFloat(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7fu;
  if (mag == 0x7fu) return floatFromBits(sign | kFloatInfBits | kFloatQuietBit);
  return floatFromBits(sign | widenMagnitude<3, 7>(mag));
}

BRAID_HD inline uint8_t floatToFp8e4m3(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & ~kFloatSignBit;
  if (abs > kFloatInfBits) return static_cast<uint8_t>(sign | 0x7fu);
  const uint32_t code = narrowMagnitude<3, 7>(abs);  // inf lands above 0x7e too
  return static_cast<uint8_t>(sign | (code < 0x7eu ? code : 0x7eu));
}

// OCP FP8 E5M2: IEEE-like, with inf and NaN, 57344 the largest.
BRAID_HD inline float fp8e5m2ToFloat(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7fu;
  const uint32_t frac = v & 0x3u;
  if (mag >= 0x7cu) {
    return floatFromBits(sign | kFloatInfBits | (frac << 21) | (frac != 0 ? kFloatQuietBit : 0u));
  }
  return floatFromBits(sign | widenMagnitude<2, 15>(mag));
}

BRAID_HD inline uint8_t floatToFp8e5m2(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & ~kFloatSignBit;
  if (abs > kFloatInfBits) return static_cast<uint8_t>(sign | 0x7eu);   // quiet NaN
  if (abs == kFloatInfBits) return static_cast<uint8_t>(sign | 0x7cu);  // inf stays inf
  const uint32_t code = narrowMagnitude<2, 15>(abs);
  return static_cast<uint8_t>(sign | (code < 0x7bu ? code : 0x7bu));  // finite overflow saturates
}

// ---- Formats: how an element is stored and what it is combined in ----
//
// Each has Storage, Acc, widen (Storage -> Acc, exact), narrow (Acc ->
// Storage, rounding) and divide (Avg's finalize of one element, as
// reduce::finalize does it; REQUIRES divisor >= 2).

template <typename T>
struct IntegerFormat {
  using Storage = T;
  using Acc = T;
  BRAID_HD static T widen(T v) { return v; }
  BRAID_HD static T narrow(T v) { return v; }
  BRAID_HD static T divide(T v, int divisor) {
    // C++ `/` after the usual promotions, truncating toward zero.
    return static_cast<T>(v / static_cast<std::common_type_t<T, int>>(divisor));
  }
};

template <typename F>
struct WideFloatFormat {
  using Storage = F;
  using Acc = F;
  BRAID_HD static F widen(F v) { return v; }
  BRAID_HD static F narrow(F v) { return v; }
  BRAID_HD static F divide(F v, int divisor) { return div(v, static_cast<F>(divisor)); }
};

// A narrow float, given its Conversion (Storage and static widen/narrow):
// combined in fp32; Avg divides in fp32 and rounds once.
template <typename Conversion>
struct NarrowFloatFormat {
  using Storage = typename Conversion::Storage;
  using Acc = float;
  BRAID_HD static float widen(Storage v) { return Conversion::widen(v); }
  BRAID_HD static Storage narrow(float f) { return Conversion::narrow(f); }
  BRAID_HD static Storage divide(Storage v, int divisor) {
    return narrow(div(widen(v), static_cast<float>(divisor)));
  }
};

struct HalfConversion {
  using Storage = uint16_t;
  BRAID_HD static float widen(uint16_t v) { return halfToFloat(v); }
  BRAID_HD static uint16_t narrow(float f) { return floatToHalf(f); }
};
struct BFloat16Conversion {
  using Storage = uint16_t;
  BRAID_HD static float widen(uint16_t v) { return bf16ToFloat(v); }
  BRAID_HD static uint16_t narrow(float f) { return floatToBf16(f); }
};
struct E4M3Conversion {
  using Storage = uint8_t;
  BRAID_HD static float widen(uint8_t v) { return fp8e4m3ToFloat(v); }
  BRAID_HD static uint8_t narrow(float f) { return floatToFp8e4m3(f); }
};
struct E5M2Conversion {
  using Storage = uint8_t;
  BRAID_HD static float widen(uint8_t v) { return fp8e5m2ToFloat(v); }
  BRAID_HD static uint8_t narrow(float f) { return floatToFp8e5m2(f); }
};

using Float16Format = NarrowFloatFormat<HalfConversion>;
using BFloat16Format = NarrowFloatFormat<BFloat16Conversion>;
using Float8E4M3Format = NarrowFloatFormat<E4M3Conversion>;
using Float8E5M2Format = NarrowFloatFormat<E5M2Conversion>;

// ---- Operators on the accumulation type ----

// Unsigned arithmetic wide enough that uint8_t does not promote to int (and
// so cannot overflow a signed type).
template <typename T>
using UnsignedArith =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct SumOp {
  template <typename A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<A>(static_cast<UnsignedArith<A>>(a) + static_cast<UnsignedArith<A>>(b));
    } else {
      return add(a, b);
    }
  }
};

struct ProdOp {
  template <typename A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<A>(static_cast<UnsignedArith<A>>(a) * static_cast<UnsignedArith<A>>(b));
    } else {
      return mul(a, b);
    }
  }
};

struct MaxOp {
  template <typename A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      return a < b ? b : a;
    } else {
      return maximum(a, b);
    }
  }
};

struct MinOp {
  template <typename A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      return b < a ? b : a;
    } else {
      return minimum(a, b);
    }
  }
};

// ---- One (format, operator) pair: the element functions of a kernel ----

template <typename Format, typename Op>
struct Reduction {
  using Storage = typename Format::Storage;
  using Acc = typename Format::Acc;

  // a op b: the host kernel's element function.
  BRAID_HD static Storage apply(Storage a, Storage b) {
    return Format::narrow(Op::apply(Format::widen(a), Format::widen(b)));
  }

  // values[0] op values[1] op ... op values[n-1], folded left to right in
  // Acc and rounded once; n == 1 gives values[0] unchanged (a bit copy, so
  // a signalling NaN stays signalling). REQUIRES: 1 <= n <= kMaxReduceInputs.
  BRAID_HD static Storage fold(const Storage* values, int n) {
    if (n == 1) return values[0];
    Acc acc = Format::widen(values[0]);
    BRAID_UNROLL
    for (int k = 1; k < kMaxReduceInputs; ++k) {
      if (k < n) acc = Op::apply(acc, Format::widen(values[k]));
    }
    return Format::narrow(acc);
  }

  // Avg's last step for one element, as reduce::finalize: divides by
  // `divisor`, and changes nothing for a divisor below 2.
  BRAID_HD static Storage finalize(Storage v, int divisor) {
    return divisor > 1 ? Format::divide(v, divisor) : v;
  }
};

// Calls visitor(Reduction<Format, Op>{}) for (type, op), with the format
// and operator braid's host kernel table uses (reduce/kernel_table.h); Avg
// combines like Sum (its divide is Reduction::finalize). Returns false, calling
// nothing, for an out-of-range type or op. Host code.
template <typename Format, typename Visitor>
bool visitOp(ReduceOp op, Visitor&& visitor) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      visitor(Reduction<Format, SumOp>{});
      return true;
    case ReduceOp::Prod:
      visitor(Reduction<Format, ProdOp>{});
      return true;
    case ReduceOp::Max:
      visitor(Reduction<Format, MaxOp>{});
      return true;
    case ReduceOp::Min:
      visitor(Reduction<Format, MinOp>{});
      return true;
  }
  return false;
}

template <typename Visitor>
bool visitReduction(DataType type, ReduceOp op, Visitor&& visitor) {
  switch (type) {
    case DataType::Int8:
      return visitOp<IntegerFormat<int8_t>>(op, visitor);
    case DataType::Uint8:
      return visitOp<IntegerFormat<uint8_t>>(op, visitor);
    case DataType::Int32:
      return visitOp<IntegerFormat<int32_t>>(op, visitor);
    case DataType::Uint32:
      return visitOp<IntegerFormat<uint32_t>>(op, visitor);
    case DataType::Int64:
      return visitOp<IntegerFormat<int64_t>>(op, visitor);
    case DataType::Uint64:
      return visitOp<IntegerFormat<uint64_t>>(op, visitor);
    case DataType::Float16:
      return visitOp<Float16Format>(op, visitor);
    case DataType::Float32:
      return visitOp<WideFloatFormat<float>>(op, visitor);
    case DataType::Float64:
      return visitOp<WideFloatFormat<double>>(op, visitor);
    case DataType::BFloat16:
      return visitOp<BFloat16Format>(op, visitor);
    case DataType::Float8E4M3:
      return visitOp<Float8E4M3Format>(op, visitor);
    case DataType::Float8E5M2:
      return visitOp<Float8E5M2Format>(op, visitor);
  }
  return false;
}

}  // namespace braid::device::cuda
