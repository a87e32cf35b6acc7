// AVX-512 kernels (F, BW and VL, with F16C). Every function here that uses
// AVX-512 carries the target attribute, and nothing here runs unless
// dispatch.cc found that the CPU supports it. As in kernels_avx2.cc, the
// shared headers carry no target attribute, so an out-of-line copy of one
// of their inline functions is baseline code whichever file emits it.
//
// The same kernels as kernels_avx2.cc, 512 bits wide, with the tail done by
// one masked step (masked-off lanes are neither read nor written, so a
// buffer may end at the edge of a page):
// - fp32 and fp64: one vector op per 16 or 8 elements; Max and Min add the
//   masked moves that make vmaxps/vminps IEEE maximum/minimum.
// - fp16: vcvtph2ps/vcvtps2ph (round to nearest even, whatever MXCSR says);
//   on every input they give the bits float_convert.h gives.
// - fp16 and bf16 Max and Min: no conversion, see OrderedLanes.
// - bf16: widening is a shift or a mask; narrowing is float_convert.h's
//   integer round-to-nearest-even, lane by lane. Not AVX512_BF16's
//   vcvtneps2bf16: run over all 2^32 fp32 inputs (on a Zen 4) it agrees with
//   floatToBf16Inline, NaNs included, except on the 16,711,678 subnormal
//   inputs that round to a nonzero bf16, where it returns +-0 (it reads
//   subnormal inputs as zero). Sums and differences of bf16 subnormals are
//   such inputs.
// - fp8: widened and rounded back through fp16, see E5M2Lanes.
// - Integers: elementwise.h's loops, vectorized by the compiler.
#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*(),
// which -Wmaybe-uninitialized then reports wherever they are inlined. The
// warning is wrong there and is silenced for this header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reduce/elementwise.h"
#include "reduce/kernel_table.h"

#define BRAID_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

namespace braid::reduce::detail {
namespace {

// ---- Generic: the compiler vectorizes elementwise.h's loops for AVX-512. ----

template <typename Op>
struct Avx512Kernel {
  BRAID_TARGET_AVX512 __attribute__((flatten)) static void run(void* dst, const void* a,
                                                               const void* b, size_t count) {
    elementwise<Op>(dst, a, b, count);
  }
};

// ---- fp32 / fp64 vector operations, bit for bit as elementwise.h's. ----

// IEEE 754-2019 maximum as FloatMax computes it. vmaxps(a, b) is
// `a > b ? a : b`: b when they compare equal (so +-0 in operand order) or
// when either is NaN. Equal operands instead take a & b (+0 over -0), and a
// NaN in a wins, so NaN propagates from either side.
BRAID_TARGET_AVX512 inline __m512 maximum(__m512 a, __m512 b) {
  const __m512i larger = _mm512_castps_si512(_mm512_max_ps(a, b));
  const __mmask16 equal = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
  const __m512i r =
      _mm512_mask_and_epi32(larger, equal, _mm512_castps_si512(a), _mm512_castps_si512(b));
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

BRAID_TARGET_AVX512 inline __m512d maximum(__m512d a, __m512d b) {
  const __m512i larger = _mm512_castpd_si512(_mm512_max_pd(a, b));
  const __mmask8 equal = _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ);
  const __m512i r =
      _mm512_mask_and_epi64(larger, equal, _mm512_castpd_si512(a), _mm512_castpd_si512(b));
  return _mm512_mask_mov_pd(_mm512_castsi512_pd(r), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
}

// Minimum likewise: vminps(a, b) is `a < b ? a : b`; equal operands take
// a | b (-0 over +0).
BRAID_TARGET_AVX512 inline __m512 minimum(__m512 a, __m512 b) {
  const __m512i smaller = _mm512_castps_si512(_mm512_min_ps(a, b));
  const __mmask16 equal = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
  const __m512i r =
      _mm512_mask_or_epi32(smaller, equal, _mm512_castps_si512(a), _mm512_castps_si512(b));
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

BRAID_TARGET_AVX512 inline __m512d minimum(__m512d a, __m512d b) {
  const __m512i smaller = _mm512_castpd_si512(_mm512_min_pd(a, b));
  const __mmask8 equal = _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ);
  const __m512i r =
      _mm512_mask_or_epi64(smaller, equal, _mm512_castpd_si512(a), _mm512_castpd_si512(b));
  return _mm512_mask_mov_pd(_mm512_castsi512_pd(r), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
}

// The vector form of each elementwise.h floating-point operation.
template <template <typename> class FloatOp>
struct VectorOp;

template <>
struct VectorOp<FloatSum> {
  BRAID_TARGET_AVX512 static __m512 apply(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  BRAID_TARGET_AVX512 static __m512d apply(__m512d a, __m512d b) { return _mm512_add_pd(a, b); }
};

template <>
struct VectorOp<FloatProd> {
  BRAID_TARGET_AVX512 static __m512 apply(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  BRAID_TARGET_AVX512 static __m512d apply(__m512d a, __m512d b) { return _mm512_mul_pd(a, b); }
};

template <>
struct VectorOp<FloatMax> {
  BRAID_TARGET_AVX512 static __m512 apply(__m512 a, __m512 b) { return maximum(a, b); }
  BRAID_TARGET_AVX512 static __m512d apply(__m512d a, __m512d b) { return maximum(a, b); }
};

template <>
struct VectorOp<FloatMin> {
  BRAID_TARGET_AVX512 static __m512 apply(__m512 a, __m512 b) { return minimum(a, b); }
  BRAID_TARGET_AVX512 static __m512d apply(__m512d a, __m512d b) { return minimum(a, b); }
};

// ---- Element formats: one step applies a vector op to the lanes of a mask. ----

struct Fp32Lanes {
  using Storage = float;
  using Mask = __mmask16;
  static constexpr size_t kLanes = 16;
  template <typename VectorOp>
  BRAID_TARGET_AVX512 static void step(float* d, const float* x, const float* y, Mask m) {
    _mm512_mask_storeu_ps(
        d, m, VectorOp::apply(_mm512_maskz_loadu_ps(m, x), _mm512_maskz_loadu_ps(m, y)));
  }
};

struct Fp64Lanes {
  using Storage = double;
  using Mask = __mmask8;
  static constexpr size_t kLanes = 8;
  template <typename VectorOp>
  BRAID_TARGET_AVX512 static void step(double* d, const double* x, const double* y, Mask m) {
    _mm512_mask_storeu_pd(
        d, m, VectorOp::apply(_mm512_maskz_loadu_pd(m, x), _mm512_maskz_loadu_pd(m, y)));
  }
};

// fp16 widened to fp32 and rounded back with vcvtph2ps/vcvtps2ph.
struct HalfLanes {
  using Storage = uint16_t;
  using Mask = __mmask16;
  static constexpr size_t kLanes = 16;
  BRAID_TARGET_AVX512 static __m512 load(const uint16_t* p, Mask m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
  template <typename VectorOp>
  BRAID_TARGET_AVX512 static void step(uint16_t* d, const uint16_t* x, const uint16_t* y, Mask m) {
    const __m512 r = VectorOp::apply(load(x, m), load(y, m));
    _mm256_mask_storeu_epi16(d, m,
                             _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// bf16 is the top half of an fp32. A step loads 32 and widens the even
// elements with a shift and the odd ones with a mask, each to its own
// vector; after the op each lane rounds into its top half, and one word
// blend puts the results back in order. No cross-lane shuffle, no pack.
struct BFloat16Lanes {
  using Storage = uint16_t;
  using Mask = __mmask32;
  static constexpr size_t kLanes = 32;

  // floatToBf16Inline lane by lane, its result in the top 16 bits (the low
  // 16 are garbage): (u + 0x7fff + lsb) rounds to nearest even; a NaN keeps
  // its sign and top payload bits and gets the quiet bit.
  BRAID_TARGET_AVX512 static __m512i roundHigh(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    return _mm512_mask_or_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u,
                                _mm512_set1_epi32(0x00400000));
  }

  template <typename VectorOp>
  BRAID_TARGET_AVX512 static void step(uint16_t* d, const uint16_t* x, const uint16_t* y, Mask m) {
    const __m512i vx = _mm512_maskz_loadu_epi16(m, x);
    const __m512i vy = _mm512_maskz_loadu_epi16(m, y);
    const __m512i oddMask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512 even = VectorOp::apply(_mm512_castsi512_ps(_mm512_slli_epi32(vx, 16)),
                                        _mm512_castsi512_ps(_mm512_slli_epi32(vy, 16)));
    const __m512 odd = VectorOp::apply(_mm512_castsi512_ps(_mm512_and_si512(vx, oddMask)),
                                       _mm512_castsi512_ps(_mm512_and_si512(vy, oddMask)));
    const __m512i r = _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(roundHigh(even), 16),
                                              roundHigh(odd));
    _mm512_mask_storeu_epi16(d, m, r);
  }
};

// fp8 through fp16, as in kernels_avx2.cc (see E5M2Lanes there): F16C
// widens exactly, and narrowing rounds to fp16 to odd, then to nearest even
// on the fp16 code.

// v in fp16, rounded to odd.
BRAID_TARGET_AVX512 inline __m256i halfRoundedToOdd(__m512 v) {
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 dropped = _mm512_cmp_ps_mask(_mm512_cvtph_ps(h), v, _CMP_NEQ_OQ);
  return _mm256_mask_mov_epi16(h, dropped, _mm256_or_si256(h, _mm256_set1_epi16(1)));
}

// An fp16 magnitude code rounded to nearest even with kDrop fewer fraction
// bits, as narrowMagnitude does on fp32 codes. Not clamped.
template <int kDrop>
BRAID_TARGET_AVX512 inline __m256i roundHalfCode(__m256i magnitude) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi16(magnitude, kDrop), _mm256_set1_epi16(1));
  const __m256i half = _mm256_set1_epi16((1 << (kDrop - 1)) - 1);
  return _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(magnitude, half), lsb), kDrop);
}

// The fp8 codes of mask m, zero-extended to 16 bits.
BRAID_TARGET_AVX512 inline __m256i loadBytes(const uint8_t* p, __mmask16 m) {
  return _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
}

// Stores the codes (each below 2^8) of mask m with their fp16 sign bits.
BRAID_TARGET_AVX512 inline void storeBytes(uint8_t* p, __mmask16 m, __m256i code, __m256i half) {
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi16(half, 8), _mm256_set1_epi16(0x80));
  _mm_mask_storeu_epi8(p, m, _mm256_cvtepi16_epi8(_mm256_or_si256(code, sign)));
}

struct E5M2Lanes {
  using Storage = uint8_t;
  using Mask = __mmask16;
  static constexpr size_t kLanes = 16;
  BRAID_TARGET_AVX512 static __m512 load(const uint8_t* p, Mask m) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(loadBytes(p, m), 8));
  }
  // Finite values saturate at 0x7b; inf stays inf, NaN becomes 0x7e.
  BRAID_TARGET_AVX512 static void store(uint8_t* p, Mask m, __m512 v) {
    const __m256i half = halfRoundedToOdd(v);
    const __m256i magnitude = _mm256_and_si256(half, _mm256_set1_epi16(0x7fff));
    __m256i code = _mm256_min_epu16(roundHalfCode<8>(magnitude), _mm256_set1_epi16(0x7b));
    code =
        _mm256_mask_mov_epi16(code, _mm256_cmpgt_epi16_mask(magnitude, _mm256_set1_epi16(0x7bff)),
                              _mm256_set1_epi16(0x7c));
    code =
        _mm256_mask_mov_epi16(code, _mm256_cmpgt_epi16_mask(magnitude, _mm256_set1_epi16(0x7c00)),
                              _mm256_set1_epi16(0x7e));
    storeBytes(p, m, code, half);
  }
  template <typename VectorOp>
  BRAID_TARGET_AVX512 static void step(uint8_t* d, const uint8_t* x, const uint8_t* y, Mask m) {
    store(d, m, VectorOp::apply(load(x, m), load(y, m)));
  }
};

struct E4M3Lanes {
  using Storage = uint8_t;
  using Mask = __mmask16;
  static constexpr size_t kLanes = 16;
  // S.EEEE.MMM as the fp16 S.0EEEE.MMM0000000; the NaN S.1111.111 as the
  // fp16 quiet NaN of that sign, which widens to the fp32 one.
  BRAID_TARGET_AVX512 static __m512 load(const uint8_t* p, Mask m) {
    const __m256i bytes = loadBytes(p, m);
    const __m256i half = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(bytes, 8), 1),
                                          _mm256_set1_epi16(static_cast<short>(0xbfff)));
    const __m256i nan =
        _mm256_or_si256(_mm256_and_si256(half, _mm256_set1_epi16(static_cast<short>(0x8000))),
                        _mm256_set1_epi16(0x7e00));
    const __mmask16 isNan = _mm256_cmpeq_epi16_mask(
        _mm256_and_si256(bytes, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7f));
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_mask_mov_epi16(half, isNan, nan)),
                         _mm512_set1_ps(256.0f));
  }
  // Finite values and inf saturate at 0x7e; NaN becomes 0x7f.
  BRAID_TARGET_AVX512 static void store(uint8_t* p, Mask m, __m512 v) {
    const __m256i half = halfRoundedToOdd(_mm512_mul_ps(v, _mm512_set1_ps(1.0f / 256.0f)));
    const __m256i magnitude = _mm256_and_si256(half, _mm256_set1_epi16(0x7fff));
    __m256i code = _mm256_min_epu16(roundHalfCode<7>(magnitude), _mm256_set1_epi16(0x7e));
    code =
        _mm256_mask_mov_epi16(code, _mm256_cmpgt_epi16_mask(magnitude, _mm256_set1_epi16(0x7c00)),
                              _mm256_set1_epi16(0x7f));
    storeBytes(p, m, code, half);
  }
  template <typename VectorOp>
  BRAID_TARGET_AVX512 static void step(uint8_t* d, const uint8_t* x, const uint8_t* y, Mask m) {
    store(d, m, VectorOp::apply(load(x, m), load(y, m)));
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

// Which operand to keep, from the keys: a where the result is true.
struct KeepLarger {
  BRAID_TARGET_AVX512 static __mmask32 first(__m512i ka, __m512i kb) {
    return _mm512_cmpgt_epi16_mask(ka, kb);
  }
};
struct KeepSmaller {
  BRAID_TARGET_AVX512 static __mmask32 first(__m512i ka, __m512i kb) {
    return _mm512_cmplt_epi16_mask(ka, kb);
  }
};

template <typename Codes>
struct OrderedLanes {
  using Storage = uint16_t;
  using Mask = __mmask32;
  static constexpr size_t kLanes = 32;

  BRAID_TARGET_AVX512 static __m512i key(__m512i v) {
    return _mm512_xor_si512(v, _mm512_srli_epi16(_mm512_srai_epi16(v, 15), 1));
  }
  BRAID_TARGET_AVX512 static __mmask32 isNan(__m512i v) {
    return _mm512_cmpgt_epi16_mask(_mm512_and_si512(v, _mm512_set1_epi16(0x7fff)),
                                   _mm512_set1_epi16(Codes::kInf));
  }

  template <typename Keep>
  BRAID_TARGET_AVX512 static void step(uint16_t* d, const uint16_t* x, const uint16_t* y, Mask m) {
    const __m512i a = _mm512_maskz_loadu_epi16(m, x);
    const __m512i b = _mm512_maskz_loadu_epi16(m, y);
    const __m512i quiet = _mm512_set1_epi16(Codes::kQuiet);
    __m512i r = _mm512_mask_blend_epi16(Keep::first(key(a), key(b)), b, a);
    r = _mm512_mask_mov_epi16(r, isNan(b), _mm512_or_si512(b, quiet));
    r = _mm512_mask_mov_epi16(r, isNan(a), _mm512_or_si512(a, quiet));
    _mm512_mask_storeu_epi16(d, m, r);
  }
};

// dst = a op b with Lanes::kLanes elements per step and one masked step for
// the tail. Exact aliasing is fine: each step loads its elements before it
// stores them.
template <typename Lanes, typename VectorOp>
BRAID_TARGET_AVX512 void vectorLoop(void* dst, const void* a, const void* b, size_t count) {
  using T = typename Lanes::Storage;
  using Mask = typename Lanes::Mask;
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  constexpr auto kAll = static_cast<Mask>(~uint64_t{0});
  size_t i = 0;
  for (; i + Lanes::kLanes <= count; i += Lanes::kLanes) {
    Lanes::template step<VectorOp>(d + i, x + i, y + i, kAll);
  }
  if (i < count) {
    const auto tail = static_cast<Mask>((uint64_t{1} << (count - i)) - 1);
    Lanes::template step<VectorOp>(d + i, x + i, y + i, tail);
  }
}

template <typename Lanes, template <typename> class FloatOp>
struct VectorKernel {
  BRAID_TARGET_AVX512 static void run(void* dst, const void* a, const void* b, size_t count) {
    vectorLoop<Lanes, VectorOp<FloatOp>>(dst, a, b, count);
  }
};

template <typename Codes, typename Keep>
struct PickKernel {
  BRAID_TARGET_AVX512 static void run(void* dst, const void* a, const void* b, size_t count) {
    vectorLoop<OrderedLanes<Codes>, Keep>(dst, a, b, count);
  }
};

template <typename F>
using FloatLanes = std::conditional_t<sizeof(F) == 4, Fp32Lanes, Fp64Lanes>;

// The hand-written kernels replace the generic ones for these operations.
template <typename F>
struct Avx512Kernel<FloatSum<F>> : VectorKernel<FloatLanes<F>, FloatSum> {};
template <typename F>
struct Avx512Kernel<FloatProd<F>> : VectorKernel<FloatLanes<F>, FloatProd> {};
template <typename F>
struct Avx512Kernel<FloatMax<F>> : VectorKernel<FloatLanes<F>, FloatMax> {};
template <typename F>
struct Avx512Kernel<FloatMin<F>> : VectorKernel<FloatLanes<F>, FloatMin> {};
template <template <typename> class FloatOp>
struct Avx512Kernel<Narrowed<Half, FloatOp>> : VectorKernel<HalfLanes, FloatOp> {};
template <template <typename> class FloatOp>
struct Avx512Kernel<Narrowed<BFloat16, FloatOp>> : VectorKernel<BFloat16Lanes, FloatOp> {};
template <template <typename> class FloatOp>
struct Avx512Kernel<Narrowed<E5M2, FloatOp>> : VectorKernel<E5M2Lanes, FloatOp> {};
template <template <typename> class FloatOp>
struct Avx512Kernel<Narrowed<E4M3, FloatOp>> : VectorKernel<E4M3Lanes, FloatOp> {};
template <>
struct Avx512Kernel<Narrowed<Half, FloatMax>> : PickKernel<HalfCodes, KeepLarger> {};
template <>
struct Avx512Kernel<Narrowed<Half, FloatMin>> : PickKernel<HalfCodes, KeepSmaller> {};
template <>
struct Avx512Kernel<Narrowed<BFloat16, FloatMax>> : PickKernel<BFloat16Codes, KeepLarger> {};
template <>
struct Avx512Kernel<Narrowed<BFloat16, FloatMin>> : PickKernel<BFloat16Codes, KeepSmaller> {};

// Only function addresses: building it runs no AVX-512 instruction.
constexpr KernelTable kAvx512Kernels = makeKernelTable<Avx512Kernel>();

}  // namespace

const KernelTable& avx512Kernels() { return kAvx512Kernels; }

}  // namespace braid::reduce::detail

#endif  // defined(__x86_64__)
