// Bit-level conversions between fp32 and the narrow floating-point formats
// (IEEE binary16, bfloat16, OCP FP8 E4M3 and E5M2), inline so that the
// reduction kernels in reduce.cc can use them per element without a call.
// reduce.h declares the out-of-line versions the rest of braid calls.
//
// Every narrow format here is sign | exponent field | fraction with the
// usual implicit leading one and subnormals at exponent field 0:
//
//   format    fraction bits  bias  largest finite  inf   NaN
//   binary16  10             15    65504           yes   exp all ones, frac != 0
//   bfloat16  7              127   ~3.39e38        yes   exp all ones, frac != 0
//   E5M2      2              15    57344           yes   exp all ones, frac != 0
//   E4M3      3              7     448             no    S.1111.111 only
//
// Widening is exact. Narrowing rounds to nearest, ties to even, subnormals
// included. A NaN narrows to a quiet NaN of the target with the input's sign
// (binary16 and bfloat16 also keep the top payload bits). Overflow: binary16
// and bfloat16 go to infinity; the fp8 formats saturate to the largest finite
// value of the same sign (E5M2 keeps an infinite input infinite, E4M3 has no
// infinity and saturates it too).
#pragma once

#include <cstdint>
#include <cstring>

namespace braid::reduce::detail {

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float floatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline constexpr uint32_t kFloatSignBit = 0x80000000u;
inline constexpr uint32_t kFloatInfBits = 0x7f800000u;
inline constexpr uint32_t kFloatQuietBit = 0x00400000u;

// `condition ? ifTrue : ifFalse`, computed with a mask. The conversions use
// it wherever an operand comes from fp32 arithmetic: GCC turns a plain ?:
// over such operands into a branch, and under its default -ftrapping-math it
// then refuses to vectorize the loop (it will not speculate fp operations).
// With masks both sides are always computed, and the kernels' loops
// vectorize with plain SSE2. Both sides are always safe to compute here.
inline uint32_t selectBits(bool condition, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

// The fp32 bits of the finite, non-negative value with magnitude code `mag`
// (exponent field << kFracBits | fraction) in a format with kFracBits
// fraction bits and bias kBias. Every such value is a normal fp32.
template <int kFracBits, int kBias>
inline uint32_t widenMagnitude(uint32_t mag) {
  constexpr int kShift = 23 - kFracBits;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - kBias) << 23;  // 2^(1 - kBias)
  // Normal: move the fields into place and rebias the exponent.
  const uint32_t normal = (mag << kShift) + (static_cast<uint32_t>(127 - kBias) << 23);
  // Subnormal m * 2^(1 - kBias - kFracBits): the fp32 (1 + m / 2^kFracBits) * 2^(1 - kBias)
  // minus 2^(1 - kBias). The subtraction is exact (Sterbenz), so it does not depend on the
  // rounding mode, and its result is normal, so flush-to-zero modes do not touch it.
  const float subnormal = floatFromBits(kMinNormal | (mag << kShift)) - floatFromBits(kMinNormal);
  return selectBits((mag >> kFracBits) != 0, normal, bitsOf(subnormal));
}

// Rounds a non-negative fp32 magnitude (bits below kFloatInfBits, or equal
// to it for infinity) to nearest even in a format with kFracBits fraction
// bits and bias kBias, and returns the narrow magnitude code (exponent field
// << kFracBits | fraction). The format must have a smaller exponent range
// than fp32. The code is not clamped: a value too large for the format, or
// infinity, yields a code above its largest finite one (callers saturate or
// go to inf).
template <int kFracBits, int kBias>
inline uint32_t narrowMagnitude(uint32_t abs) {
  constexpr int kDrop = 23 - kFracBits;  // fraction bits that round away
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - kBias) << 23;  // 2^(1 - kBias)

  // Normal in the target: rebias the exponent, then round the low kDrop bits
  // to nearest even by adding just under half an ulp plus the kept lsb; a
  // carry out of the fraction bumps the exponent, as it should. (For small
  // `abs` the subtraction wraps; that result is not selected.)
  const uint32_t rebased = abs - (static_cast<uint32_t>(127 - kBias) << 23);
  const uint32_t normal =
      (rebased + ((1u << (kDrop - 1)) - 1u) + ((rebased >> kDrop) & 1u)) >> kDrop;

  // Subnormal in the target: count |x| in units of the smallest subnormal
  // 2^(1 - kBias - kFracBits) and round that to nearest even. Each step is
  // exact in fp32 whatever the rounding mode: scaling by a power of two
  // (the input is clamped so that no overflow can occur), truncating to an
  // integer, and subtracting that integer part. fp32 subnormal inputs
  // (even if a denormals-are-zero mode flushes them) give zero, correctly.
  // A result of 1 << kFracBits is the smallest normal, encoded correctly.
  static_assert(kFracBits + kBias - 1 < 32, "the unit scale must fit in an integer");
  constexpr float kUnitsPerOne = static_cast<float>(1u << (kFracBits + kBias - 1));
  const float units = floatFromBits(abs < kMinNormal ? abs : kMinNormal) * kUnitsPerOne;
  const int32_t whole = static_cast<int32_t>(units);  // truncates; at most 1 << kFracBits
  const float fraction = units - static_cast<float>(whole);
  // Bitwise, not short-circuit, operators: no control flow, so loops vectorize.
  const uint32_t roundUp = static_cast<uint32_t>(fraction > 0.5f) |
                           (static_cast<uint32_t>(fraction == 0.5f) & static_cast<uint32_t>(whole));
  const uint32_t subnormal = static_cast<uint32_t>(whole) + (roundUp & 1u);

  return selectBits(abs >= kMinNormal, normal, subnormal);
}

// ---- IEEE binary16 ----

inline float halfToFloatInline(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7fffu;
  const uint32_t frac = h & 0x3ffu;
  // inf, or NaN with its payload kept and the quiet bit set.
  const uint32_t special = kFloatInfBits | (frac << 13) | (frac != 0 ? kFloatQuietBit : 0u);
  return floatFromBits(sign | selectBits(mag >= 0x7c00u, special, widenMagnitude<10, 15>(mag)));
}

inline uint16_t floatToHalfInline(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & ~kFloatSignBit;
  const uint32_t code = narrowMagnitude<10, 15>(abs);  // inf lands above 0x7c00 too
  const uint32_t rounded = selectBits(code < 0x7c00u, code, 0x7c00u);
  const uint32_t nan = 0x7e00u | ((abs >> 13) & 0x1ffu);  // top payload bits, quiet bit
  return static_cast<uint16_t>(sign | selectBits(abs > kFloatInfBits, nan, rounded));
}

// ---- bfloat16: the top half of an fp32 ----

inline float bf16ToFloatInline(uint16_t h) { return floatFromBits(static_cast<uint32_t>(h) << 16); }

inline uint16_t floatToBf16Inline(float f) {
  const uint32_t u = bitsOf(f);
  // Same exponent range as fp32, so subnormals need no special case; a
  // carry out of the fraction bumps the exponent, up to inf on overflow.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;  // top payload bits, quiet bit
  return static_cast<uint16_t>((u & ~kFloatSignBit) > kFloatInfBits ? nan : rounded);
}

// ---- OCP FP8 E4M3: no infinities, S.1111.111 is the only NaN ----

inline float fp8e4m3ToFloatInline(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7fu;
  const uint32_t nan = kFloatInfBits | kFloatQuietBit;
  return floatFromBits(sign | selectBits(mag == 0x7fu, nan, widenMagnitude<3, 7>(mag)));
}

inline uint8_t floatToFp8e4m3Inline(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & ~kFloatSignBit;
  const uint32_t code = narrowMagnitude<3, 7>(abs);  // inf lands above 0x7e too
  const uint32_t saturated = selectBits(code < 0x7eu, code, 0x7eu);
  return static_cast<uint8_t>(sign | selectBits(abs > kFloatInfBits, 0x7fu, saturated));
}

// ---- OCP FP8 E5M2: IEEE-like, with inf and NaN ----

inline float fp8e5m2ToFloatInline(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7fu;
  const uint32_t frac = v & 0x3u;
  const uint32_t special = kFloatInfBits | (frac << 21) | (frac != 0 ? kFloatQuietBit : 0u);
  return floatFromBits(sign | selectBits(mag >= 0x7cu, special, widenMagnitude<2, 15>(mag)));
}

inline uint8_t floatToFp8e5m2Inline(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs = u & ~kFloatSignBit;
  const uint32_t code = narrowMagnitude<2, 15>(abs);
  const uint32_t saturated = selectBits(code < 0x7bu, code, 0x7bu);  // finite overflow
  const uint32_t special = abs > kFloatInfBits ? 0x7eu : 0x7cu;      // quiet NaN, or inf
  return static_cast<uint8_t>(sign | selectBits(abs >= kFloatInfBits, special, saturated));
}

}  // namespace braid::reduce::detail
