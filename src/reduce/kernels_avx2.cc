// AVX2 kernels (with F16C). Every function here that uses AVX2 carries the
// target attribute, and nothing here runs unless dispatch.cc found that the
// CPU supports it. The shared headers (elementwise.h, float_convert.h) carry
// no target attribute, so an out-of-line copy of one of their inline
// functions is baseline code whichever file emits it; they become AVX2 only
// where inlined into a function here. (Per-file -mavx2 flags would not give
// that guarantee: the linker may keep any file's copy of an inline function.)
//
// - fp32 and fp64: one vector op per 8 or 4 elements; Max and Min add the
//   blends that make vmaxps/vminps IEEE maximum/minimum (see maximum()).
// - fp16: F16C's vcvtph2ps/vcvtps2ph (round to nearest even, whatever
//   MXCSR says); on every input they give the bits float_convert.h gives.
// - fp16 and bf16 Max and Min: no conversion, see OrderedLanes.
// - bf16: widening is a shift or a mask; narrowing is float_convert.h's
//   integer round-to-nearest-even, lane by lane, with the NaN blend only in
//   steps that have a NaN.
// - fp8: widened and rounded back through fp16 with F16C, see E5M2Lanes.
// - Integers: elementwise.h's loops, vectorized by the compiler for AVX2.
// Tails (count not a multiple of the vector width) run elementwise.h's
// scalar operation, so they agree trivially.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reduce/elementwise.h"
#include "reduce/kernel_table.h"

#define BRAID_TARGET_AVX2 __attribute__((target("avx2,f16c")))

namespace braid::reduce::detail {
namespace {

// ---- Generic: the compiler vectorizes elementwise.h's loops for AVX2. ----

template <typename Op>
struct Avx2Kernel {
  BRAID_TARGET_AVX2 __attribute__((flatten)) static void run(void* dst, const void* a,
                                                             const void* b, size_t count) {
    elementwise<Op>(dst, a, b, count);
  }
};

// ---- fp32 / fp64 vector operations, bit for bit as elementwise.h's. ----

// IEEE 754-2019 maximum as FloatMax computes it. vmaxps(a, b) is
// `a > b ? a : b`: b when they compare equal (so +-0 in operand order) or
// when either is NaN. Equal operands instead take a & b (+0 over -0), and a
// NaN in a wins, so NaN propagates from either side.
BRAID_TARGET_AVX2 inline __m256 maximum(__m256 a, __m256 b) {
  const __m256 larger = _mm256_max_ps(a, b);
  const __m256 r = _mm256_blendv_ps(larger, _mm256_and_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
  return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

BRAID_TARGET_AVX2 inline __m256d maximum(__m256d a, __m256d b) {
  const __m256d larger = _mm256_max_pd(a, b);
  const __m256d r = _mm256_blendv_pd(larger, _mm256_and_pd(a, b), _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
  return _mm256_blendv_pd(r, a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
}

// Minimum likewise: vminps(a, b) is `a < b ? a : b`; equal operands take
// a | b (-0 over +0).
BRAID_TARGET_AVX2 inline __m256 minimum(__m256 a, __m256 b) {
  const __m256 smaller = _mm256_min_ps(a, b);
  const __m256 r = _mm256_blendv_ps(smaller, _mm256_or_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
  return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

BRAID_TARGET_AVX2 inline __m256d minimum(__m256d a, __m256d b) {
  const __m256d smaller = _mm256_min_pd(a, b);
  const __m256d r = _mm256_blendv_pd(smaller, _mm256_or_pd(a, b), _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
  return _mm256_blendv_pd(r, a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
}

// The vector form of each elementwise.h floating-point operation.
template <template <typename> class FloatOp>
struct VectorOp;

template <>
struct VectorOp<FloatSum> {
  BRAID_TARGET_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  BRAID_TARGET_AVX2 static __m256d apply(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
};

template <>
struct VectorOp<FloatProd> {
  BRAID_TARGET_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  BRAID_TARGET_AVX2 static __m256d apply(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
};

template <>
struct VectorOp<FloatMax> {
  BRAID_TARGET_AVX2 static __m256 apply(__m256 a, __m256 b) { return maximum(a, b); }
  BRAID_TARGET_AVX2 static __m256d apply(__m256d a, __m256d b) { return maximum(a, b); }
};

template <>
struct VectorOp<FloatMin> {
  BRAID_TARGET_AVX2 static __m256 apply(__m256 a, __m256 b) { return minimum(a, b); }
  BRAID_TARGET_AVX2 static __m256d apply(__m256d a, __m256d b) { return minimum(a, b); }
};

// ---- Element formats: one step applies a vector op to kLanes elements. ----

struct Fp32Lanes {
  using Storage = float;
  static constexpr size_t kLanes = 8;
  template <typename VectorOp>
  BRAID_TARGET_AVX2 static void step(float* d, const float* x, const float* y) {
    _mm256_storeu_ps(d, VectorOp::apply(_mm256_loadu_ps(x), _mm256_loadu_ps(y)));
  }
};

struct Fp64Lanes {
  using Storage = double;
  static constexpr size_t kLanes = 4;
  template <typename VectorOp>
  BRAID_TARGET_AVX2 static void step(double* d, const double* x, const double* y) {
    _mm256_storeu_pd(d, VectorOp::apply(_mm256_loadu_pd(x), _mm256_loadu_pd(y)));
  }
};

// fp16 widened to fp32 and rounded back with F16C.
struct HalfLanes {
  using Storage = uint16_t;
  static constexpr size_t kLanes = 8;
  BRAID_TARGET_AVX2 static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <typename VectorOp>
  BRAID_TARGET_AVX2 static void step(uint16_t* d, const uint16_t* x, const uint16_t* y) {
    const __m256 r = VectorOp::apply(load(x), load(y));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// bf16 is the top half of an fp32. A step loads 16 and widens the even
// elements with a shift and the odd ones with a mask, each to its own
// vector; after the op each lane rounds into its top half, and one word
// blend puts the results back in order. No cross-lane shuffle, no pack.
struct BFloat16Lanes {
  using Storage = uint16_t;
  static constexpr size_t kLanes = 16;

  // floatToBf16Inline lane by lane, its result in the top 16 bits (the low
  // 16 are garbage): (u + 0x7fff + lsb) rounds to nearest even.
  BRAID_TARGET_AVX2 static __m256i roundHigh(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  }

  // A NaN keeps its sign and top payload bits and gets the quiet bit.
  BRAID_TARGET_AVX2 static __m256i roundHighWithNan(__m256 v) {
    const __m256i nan = _mm256_or_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x00400000));
    return _mm256_blendv_epi8(roundHigh(v), nan,
                              _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }

  template <typename VectorOp>
  BRAID_TARGET_AVX2 static void step(uint16_t* d, const uint16_t* x, const uint16_t* y) {
    const __m256i vx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i vy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y));
    const __m256i oddMask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256 even = VectorOp::apply(_mm256_castsi256_ps(_mm256_slli_epi32(vx, 16)),
                                        _mm256_castsi256_ps(_mm256_slli_epi32(vy, 16)));
    const __m256 odd = VectorOp::apply(_mm256_castsi256_ps(_mm256_and_si256(vx, oddMask)),
                                       _mm256_castsi256_ps(_mm256_and_si256(vy, oddMask)));
    // NaN results are rare: one test for both vectors, then the blends.
    const __m256 anyNan = _mm256_cmp_ps(even, odd, _CMP_UNORD_Q);
    __m256i r;
    if (_mm256_testz_ps(anyNan, anyNan)) {
      r = _mm256_blend_epi16(_mm256_srli_epi32(roundHigh(even), 16), roundHigh(odd), 0xaa);
    } else {
      r = _mm256_blend_epi16(_mm256_srli_epi32(roundHighWithNan(even), 16), roundHighWithNan(odd),
                             0xaa);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), r);
  }
};

// fp8 through fp16. An fp8 code is an fp16 code cut short: E5M2 is the top
// byte of the fp16 of the same value, and E4M3 the top bits of the fp16 of
// its value times 2^-8 (same exponent field and subnormal range). So F16C
// widens fp8 exactly, and narrowing goes through fp16 rounded to odd
// (toward zero, lowest bit set if that dropped anything): with 7 or 8
// fraction bits more than the fp8 code it keeps enough for the second
// rounding, to nearest even on the fp16 code, to be the correct one. The
// scalings by 2^8 and 2^-8 are exact (a product too small for fp32's
// normal range is far below E4M3's smallest subnormal: it rounds to zero
// either way).

// v in fp16, rounded to odd.
BRAID_TARGET_AVX2 inline __m128i halfRoundedToOdd(__m256 v) {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256i dropped = _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtph_ps(h), v, _CMP_NEQ_OQ));
  const __m128i dropped16 =
      _mm_packs_epi32(_mm256_castsi256_si128(dropped), _mm256_extracti128_si256(dropped, 1));
  return _mm_or_si128(h, _mm_and_si128(dropped16, _mm_set1_epi16(1)));
}

// An fp16 magnitude code rounded to nearest even with kDrop fewer fraction
// bits, as narrowMagnitude does on fp32 codes. Not clamped.
template <int kDrop>
BRAID_TARGET_AVX2 inline __m128i roundHalfCode(__m128i magnitude) {
  const __m128i lsb = _mm_and_si128(_mm_srli_epi16(magnitude, kDrop), _mm_set1_epi16(1));
  const __m128i half = _mm_set1_epi16((1 << (kDrop - 1)) - 1);
  return _mm_srli_epi16(_mm_add_epi16(_mm_add_epi16(magnitude, half), lsb), kDrop);
}

// 8 fp8 codes, zero-extended to 16 bits.
BRAID_TARGET_AVX2 inline __m128i loadBytes(const uint8_t* p) {
  return _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Stores 8 codes (each below 2^8) with their fp16 sign bits.
BRAID_TARGET_AVX2 inline void storeBytes(uint8_t* p, __m128i code, __m128i half) {
  const __m128i sign = _mm_and_si128(_mm_srli_epi16(half, 8), _mm_set1_epi16(0x80));
  const __m128i r = _mm_or_si128(code, sign);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(r, r));
}

struct E5M2Lanes {
  using Storage = uint8_t;
  static constexpr size_t kLanes = 8;
  BRAID_TARGET_AVX2 static __m256 load(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_slli_epi16(loadBytes(p), 8));
  }
  // Finite values saturate at 0x7b; inf stays inf, NaN becomes 0x7e.
  BRAID_TARGET_AVX2 static void store(uint8_t* p, __m256 v) {
    const __m128i half = halfRoundedToOdd(v);
    const __m128i magnitude = _mm_and_si128(half, _mm_set1_epi16(0x7fff));
    const __m128i finite = _mm_min_epu16(roundHalfCode<8>(magnitude), _mm_set1_epi16(0x7b));
    const __m128i special = _mm_blendv_epi8(_mm_set1_epi16(0x7c), _mm_set1_epi16(0x7e),
                                            _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7c00)));
    storeBytes(p,
               _mm_blendv_epi8(finite, special, _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7bff))),
               half);
  }
  template <typename VectorOp>
  BRAID_TARGET_AVX2 static void step(uint8_t* d, const uint8_t* x, const uint8_t* y) {
    store(d, VectorOp::apply(load(x), load(y)));
  }
};

struct E4M3Lanes {
  using Storage = uint8_t;
  static constexpr size_t kLanes = 8;
  // S.EEEE.MMM as the fp16 S.0EEEE.MMM0000000; the NaN S.1111.111 as the
  // fp16 quiet NaN of that sign, which widens to the fp32 one.
  BRAID_TARGET_AVX2 static __m256 load(const uint8_t* p) {
    const __m128i bytes = loadBytes(p);
    const __m128i half = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(bytes, 8), 1),
                                       _mm_set1_epi16(static_cast<short>(0xbfff)));
    const __m128i nan = _mm_or_si128(
        _mm_and_si128(half, _mm_set1_epi16(static_cast<short>(0x8000))), _mm_set1_epi16(0x7e00));
    const __m128i isNan =
        _mm_cmpeq_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_blendv_epi8(half, nan, isNan)),
                         _mm256_set1_ps(256.0f));
  }
  // Finite values and inf saturate at 0x7e; NaN becomes 0x7f.
  BRAID_TARGET_AVX2 static void store(uint8_t* p, __m256 v) {
    const __m128i half = halfRoundedToOdd(_mm256_mul_ps(v, _mm256_set1_ps(1.0f / 256.0f)));
    const __m128i magnitude = _mm_and_si128(half, _mm_set1_epi16(0x7fff));
    const __m128i code = _mm_min_epu16(roundHalfCode<7>(magnitude), _mm_set1_epi16(0x7e));
    storeBytes(p,
               _mm_blendv_epi8(code, _mm_set1_epi16(0x7f),
                               _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7c00))),
               half);
  }
  template <typename VectorOp>
  BRAID_TARGET_AVX2 static void step(uint8_t* d, const uint8_t* x, const uint8_t* y) {
    store(d, VectorOp::apply(load(x), load(y)));
  }
};

// fp16 and bf16 Max and Min return one of their operands, so they need no
// conversion. Read as sign-magnitude integers with the magnitude bits of
// negative codes flipped, the codes order as their values do, -0 below +0:
// the larger (smaller) key is IEEE maximum (minimum). A NaN operand, a's
// before b's, comes back with its quiet bit set, as widening it and
// rounding it back does (elementwise.h's choice of NaN).
struct HalfCodes {
  static constexpr int kInf = 0x7c00;
  static constexpr int kQuiet = 0x0200;
};
struct BFloat16Codes {
  static constexpr int kInf = 0x7f80;
  static constexpr int kQuiet = 0x0040;
};

// Which operand to keep, from the keys: a where the result lane is all ones.
struct KeepLarger {
  BRAID_TARGET_AVX2 static __m256i first(__m256i ka, __m256i kb) {
    return _mm256_cmpgt_epi16(ka, kb);
  }
};
struct KeepSmaller {
  BRAID_TARGET_AVX2 static __m256i first(__m256i ka, __m256i kb) {
    return _mm256_cmpgt_epi16(kb, ka);
  }
};

template <typename Codes>
struct OrderedLanes {
  using Storage = uint16_t;
  static constexpr size_t kLanes = 16;

  BRAID_TARGET_AVX2 static __m256i key(__m256i v) {
    return _mm256_xor_si256(v, _mm256_srli_epi16(_mm256_srai_epi16(v, 15), 1));
  }
  BRAID_TARGET_AVX2 static __m256i isNan(__m256i v) {
    return _mm256_cmpgt_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7fff)),
                              _mm256_set1_epi16(Codes::kInf));
  }

  template <typename Keep>
  BRAID_TARGET_AVX2 static void step(uint16_t* d, const uint16_t* x, const uint16_t* y) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y));
    const __m256i quiet = _mm256_set1_epi16(Codes::kQuiet);
    __m256i r = _mm256_blendv_epi8(b, a, Keep::first(key(a), key(b)));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(b, quiet), isNan(b));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(a, quiet), isNan(a));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), r);
  }
};

// dst = a op b with Lanes::kLanes elements per step; the scalar ScalarOp
// (elementwise.h's, bit-identical) takes the tail. Exact aliasing is fine:
// each step loads its elements before it stores them.
template <typename Lanes, typename VectorOp, typename ScalarOp>
BRAID_TARGET_AVX2 void vectorLoop(void* dst, const void* a, const void* b, size_t count) {
  using T = typename Lanes::Storage;
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  size_t i = 0;
  for (; i + Lanes::kLanes <= count; i += Lanes::kLanes) {
    Lanes::template step<VectorOp>(d + i, x + i, y + i);
  }
  for (; i < count; ++i) d[i] = ScalarOp::apply(x[i], y[i]);
}

template <typename Lanes, template <typename> class FloatOp>
struct FloatKernel {
  BRAID_TARGET_AVX2 static void run(void* dst, const void* a, const void* b, size_t count) {
    vectorLoop<Lanes, VectorOp<FloatOp>, FloatOp<typename Lanes::Storage>>(dst, a, b, count);
  }
};

template <typename Lanes, typename Format, template <typename> class FloatOp>
struct NarrowKernel {
  BRAID_TARGET_AVX2 static void run(void* dst, const void* a, const void* b, size_t count) {
    vectorLoop<Lanes, VectorOp<FloatOp>, Narrowed<Format, FloatOp>>(dst, a, b, count);
  }
};

template <typename Codes, typename Keep, typename Format, template <typename> class FloatOp>
struct PickKernel {
  BRAID_TARGET_AVX2 static void run(void* dst, const void* a, const void* b, size_t count) {
    vectorLoop<OrderedLanes<Codes>, Keep, Narrowed<Format, FloatOp>>(dst, a, b, count);
  }
};

template <typename F>
using FloatLanes = std::conditional_t<sizeof(F) == 4, Fp32Lanes, Fp64Lanes>;

// The hand-written kernels replace the generic ones for these operations.
template <typename F>
struct Avx2Kernel<FloatSum<F>> : FloatKernel<FloatLanes<F>, FloatSum> {};
template <typename F>
struct Avx2Kernel<FloatProd<F>> : FloatKernel<FloatLanes<F>, FloatProd> {};
template <typename F>
struct Avx2Kernel<FloatMax<F>> : FloatKernel<FloatLanes<F>, FloatMax> {};
template <typename F>
struct Avx2Kernel<FloatMin<F>> : FloatKernel<FloatLanes<F>, FloatMin> {};
template <template <typename> class FloatOp>
struct Avx2Kernel<Narrowed<Half, FloatOp>> : NarrowKernel<HalfLanes, Half, FloatOp> {};
template <template <typename> class FloatOp>
struct Avx2Kernel<Narrowed<BFloat16, FloatOp>> : NarrowKernel<BFloat16Lanes, BFloat16, FloatOp> {};
template <template <typename> class FloatOp>
struct Avx2Kernel<Narrowed<E5M2, FloatOp>> : NarrowKernel<E5M2Lanes, E5M2, FloatOp> {};
template <template <typename> class FloatOp>
struct Avx2Kernel<Narrowed<E4M3, FloatOp>> : NarrowKernel<E4M3Lanes, E4M3, FloatOp> {};
template <>
struct Avx2Kernel<Narrowed<Half, FloatMax>> : PickKernel<HalfCodes, KeepLarger, Half, FloatMax> {};
template <>
struct Avx2Kernel<Narrowed<Half, FloatMin>> : PickKernel<HalfCodes, KeepSmaller, Half, FloatMin> {};
template <>
struct Avx2Kernel<Narrowed<BFloat16, FloatMax>>
    : PickKernel<BFloat16Codes, KeepLarger, BFloat16, FloatMax> {};
template <>
struct Avx2Kernel<Narrowed<BFloat16, FloatMin>>
    : PickKernel<BFloat16Codes, KeepSmaller, BFloat16, FloatMin> {};

// Only function addresses: building it runs no AVX2 instruction.
constexpr KernelTable kAvx2Kernels = makeKernelTable<Avx2Kernel>();

}  // namespace

const KernelTable& avx2Kernels() { return kAvx2Kernels; }

}  // namespace braid::reduce::detail

#endif  // defined(__x86_64__)
