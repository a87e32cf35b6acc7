// Tests for the element functions of the CUDA kernels
// (src/device/cuda/element_ops.h), compiled here by the host compiler: they
// must give bit for bit the results of braid's host kernels.
//
// - Two inputs: for every type and op, on all pairs of special values (NaNs
//   with payloads and both signs, signalling NaNs, infinities, zeros of both
//   signs, subnormals, the largest finite values, values whose sum or
//   product overflows fp16 or fp8, integer extremes) and on many random bit
//   patterns, Reduction::apply and Reduction::fold(n = 2) equal
//   reduce::kernelFor(type, op) over the same buffers. The one allowance is
//   the host's own (reduce.h): for Sum, Prod and Avg of two NaNs either
//   operand's payload may come back, so the result may also be
//   apply(b, a). (As built, the host kernels return the second operand's,
//   and so do the element functions; the allowance keeps a compiler that
//   orders the operands differently from failing these tests.)
// - Avg's finalize equals reduce::finalize at divisors 2, 3, 5 and 7.
// - n = 3..8 inputs: fold equals a reference written here from the
//   definition (widen with the host conversions, fold left to right in fp32
//   or the type itself with plain C++ operators, round once with the host
//   conversion), and fold + finalize at divisor n equals the reference
//   followed by reduce::finalize. Where the reference meets two NaN
//   operands of Sum or Prod, any NaN is accepted (the same allowance).
// - n = 1 is a bit copy, signalling NaNs included.
// - The narrow-float conversions equal the host's on every fp16, bf16 and
//   fp8 pattern and on every fp32 rounding case of each format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "device/cuda/element_ops.h"
#include "reduce/reduce.h"

namespace braid::device::cuda {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
    DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
    DataType::Float64, DataType::BFloat16, DataType::Float8E4M3, DataType::Float8E5M2,
};

constexpr const char* kTypeNames[] = {"int8",    "uint8",    "int32",      "uint32",
                                      "int64",   "uint64",   "float16",    "float32",
                                      "float64", "bfloat16", "float8e4m3", "float8e5m2"};
constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};
constexpr int kTypeBits[] = {8, 8, 32, 32, 64, 64, 16, 32, 64, 16, 8, 8};

const char* nameOf(DataType type) { return kTypeNames[static_cast<int>(type)]; }
const char* nameOf(ReduceOp op) { return kOpNames[static_cast<int>(op)]; }
int bitsIn(DataType type) { return kTypeBits[static_cast<int>(type)]; }
uint64_t maskOf(DataType type) {
  return bitsIn(type) == 64 ? ~uint64_t{0} : (uint64_t{1} << bitsIn(type)) - 1;
}

bool isFloat(DataType type) {
  return type == DataType::Float16 || type == DataType::Float32 || type == DataType::Float64 ||
         type == DataType::BFloat16 || type == DataType::Float8E4M3 || type == DataType::Float8E5M2;
}

// Whether a bit pattern of `type` is a NaN, from the formats' layouts.
bool isNaNPattern(DataType type, uint64_t bits) {
  switch (type) {
    case DataType::Float16:
      return (bits & 0x7fff) > 0x7c00;
    case DataType::BFloat16:
      return (bits & 0x7fff) > 0x7f80;
    case DataType::Float32:
      return (bits & 0x7fffffff) > 0x7f800000;
    case DataType::Float64:
      return (bits & 0x7fffffffffffffff) > 0x7ff0000000000000;
    case DataType::Float8E4M3:
      return (bits & 0x7f) == 0x7f;
    case DataType::Float8E5M2:
      return (bits & 0x7f) > 0x7c;
    default:
      return false;
  }
}

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

template <typename T>
uint64_t toBits(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);  // little-endian: the low bytes
  return u;
}

template <typename T>
T fromBits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// Counts mismatches in one check, reporting the first few in full.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  ~Mismatches() { EXPECT_EQ(count_, 0) << what_ << ": mismatches in total"; }
  void add(const std::string& detail) {
    if (++count_ <= 8) ADD_FAILURE() << what_ << ": " << detail;
  }

 private:
  std::string what_;
  int count_ = 0;
};

// ---- Test values, as bit patterns of the type ----

std::vector<uint64_t> integerSpecials(int bits) {
  const uint64_t all = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const uint64_t min = uint64_t{1} << (bits - 1);   // the signed minimum
  const uint64_t root = uint64_t{1} << (bits / 2);  // squares to 0 (mod 2^bits)
  return {0,   1,       2,       3,    7,        min - 1,  min,     min + 1,
          all, all - 1, all - 6, root, root + 1, root - 1, all / 3, all / 3 * 2};
}

std::vector<uint64_t> specialsOf(DataType type) {
  switch (type) {
    case DataType::Float16:
      return {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfc01, 0x7d55, 0xff3f,
              0x7fff, 0x0001, 0x8001, 0x0002, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x7bff, 0xfbff,
              0x7bfe, 0x7800, 0x5bff, 0x3c00, 0xbc00, 0x3c01, 0x3555, 0x1400, 0x0200, 0x2000};
    case DataType::BFloat16:
      return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fa5,
              0x7fff, 0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x7f00,
              0x3f80, 0xbf80, 0x3f81, 0x4040, 0x0101, 0x1f80, 0x2000, 0x5f80};
    case DataType::Float32:
      return {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
              0xff800001, 0x7fa5a5a5, 0xffffffff, 0x7fffffff, 0x00000001, 0x80000001, 0x007fffff,
              0x807fffff, 0x00800000, 0x00400000, 0x7f7fffff, 0xff7fffff, 0x7f000000, 0x3f800000,
              0xbf800000, 0x3f800001, 0x33800000, 0x477fe000, 0x477ff000, 0x43e00000, 0x43e80000,
              0x47600000, 0x47700000, 0x1f800000, 0x5f800000, 0x3eaaaaab, 0x4b800000};
    case DataType::Float64:
      return {0x0000000000000000, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
              0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001, 0xfff0000000000001,
              0x7ff5555555555555, 0xffffffffffffffff, 0x0000000000000001, 0x8000000000000001,
              0x000fffffffffffff, 0x0010000000000000, 0x7fefffffffffffff, 0xffefffffffffffff,
              0x7fe0000000000000, 0x3ff0000000000000, 0xbff0000000000000, 0x3ff0000000000001,
              0x1ff0000000000000, 0x5ff0000000000000, 0x3fd5555555555555, 0x4340000000000000};
    case DataType::Float8E4M3:
    case DataType::Float8E5M2: {
      std::vector<uint64_t> all;  // every pattern
      for (uint64_t v = 0; v < 256; ++v) all.push_back(v);
      return all;
    }
    default:
      return integerSpecials(bitsIn(type));
  }
}

// A test value: a special (1 in 8), else random bits.
uint64_t randomValue(DataType type, const std::vector<uint64_t>& specials, std::mt19937_64& rng) {
  if (rng() % 8 == 0) return specials[rng() % specials.size()];
  return rng() & maskOf(type);
}

// `base` with its low half of bits replaced and its sign maybe flipped: a
// value of about the same magnitude, so that sums cancel and round.
uint64_t nearValue(DataType type, uint64_t base, std::mt19937_64& rng) {
  const int bits = bitsIn(type);
  const uint64_t low = (uint64_t{1} << (bits / 2)) - 1;
  uint64_t v = (base & ~low) | (rng() & low);
  if (rng() % 2 == 0) v ^= uint64_t{1} << (bits - 1);
  return v & maskOf(type);
}

// ---- Two inputs ----

struct Pairs {
  std::vector<uint64_t> a;
  std::vector<uint64_t> b;
};

// Every pair of specials (so every pair of patterns for fp8), then random
// pairs and pairs of nearby values.
Pairs pairsFor(DataType type) {
  const std::vector<uint64_t> specials = specialsOf(type);
  Pairs pairs;
  for (uint64_t x : specials) {
    for (uint64_t y : specials) {
      pairs.a.push_back(x);
      pairs.b.push_back(y);
    }
  }
  std::mt19937_64 rng(0x5eed0000u + static_cast<unsigned>(type));
  for (int i = 0; i < 40000; ++i) {
    const uint64_t x = randomValue(type, specials, rng);
    pairs.a.push_back(x);
    pairs.b.push_back(i % 2 == 0 ? randomValue(type, specials, rng) : nearValue(type, x, rng));
  }
  return pairs;
}

// Compares Reduction::apply and Reduction::fold (n = 2, as the kernels call
// it) with the host kernel for (type, op) on pairsFor(type).
void checkTwoInputsMatchHostKernel(DataType type, ReduceOp op) {
  const Pairs pairs = pairsFor(type);
  const bool visited = visitReduction(type, op, [&](auto reduction) {
    using R = decltype(reduction);
    using T = typename R::Storage;
    const size_t count = pairs.a.size();
    std::vector<T> a(count);
    std::vector<T> b(count);
    for (size_t i = 0; i < count; ++i) {
      a[i] = fromBits<T>(pairs.a[i]);
      b[i] = fromBits<T>(pairs.b[i]);
    }
    std::vector<T> host(count);
    reduce::kernelFor(type, op)(host.data(), a.data(), b.data(), count);

    Mismatches mismatches(std::string(nameOf(type)) + " " + nameOf(op));
    const bool nanPayloadMayVary = isFloat(type) && op != ReduceOp::Max && op != ReduceOp::Min;
    for (size_t i = 0; i < count; ++i) {
      const T operands[2] = {a[i], b[i]};
      const uint64_t expected = toBits(host[i]);
      const uint64_t applied = toBits(R::apply(a[i], b[i]));
      const uint64_t folded = toBits(R::fold(operands, 2));
      const uint64_t swapped = toBits(R::apply(b[i], a[i]));
      const bool bothNaN = isNaNPattern(type, pairs.a[i]) && isNaNPattern(type, pairs.b[i]);
      const bool allowSwap = nanPayloadMayVary && bothNaN && expected == swapped;
      if ((applied != expected || folded != expected) && !allowSwap) {
        mismatches.add(hex(pairs.a[i]) + " op " + hex(pairs.b[i]) + ": host " + hex(expected) +
                       ", apply " + hex(applied) + ", fold " + hex(folded));
      }
    }
  });
  EXPECT_TRUE(visited) << nameOf(type) << " " << nameOf(op);
}

TEST(DeviceKernels, TwoInputSumMatchesHostKernelForEveryType) {
  for (DataType type : kAllTypes) checkTwoInputsMatchHostKernel(type, ReduceOp::Sum);
}

TEST(DeviceKernels, TwoInputProdMatchesHostKernelForEveryType) {
  for (DataType type : kAllTypes) checkTwoInputsMatchHostKernel(type, ReduceOp::Prod);
}

TEST(DeviceKernels, TwoInputMaxMatchesHostKernelForEveryType) {
  for (DataType type : kAllTypes) checkTwoInputsMatchHostKernel(type, ReduceOp::Max);
}

TEST(DeviceKernels, TwoInputMinMatchesHostKernelForEveryType) {
  for (DataType type : kAllTypes) checkTwoInputsMatchHostKernel(type, ReduceOp::Min);
}

TEST(DeviceKernels, TwoInputAvgCombinesAsHostKernelForEveryType) {
  for (DataType type : kAllTypes) checkTwoInputsMatchHostKernel(type, ReduceOp::Avg);
}

// The cases the GPU's own NaN rule (always 0x7fffffff) would get wrong:
// one NaN operand keeps its sign and payload, an invalid operation gives
// the host's default NaN.
TEST(DeviceKernels, Float32NaNResultsFollowTheHostRule) {
  using R = Reduction<WideFloatFormat<float>, SumOp>;
  using P = Reduction<WideFloatFormat<float>, ProdOp>;
  const float inf = fromBits<float>(0x7f800000);
  const float signallingNaN = fromBits<float>(0xff812345);
  const float one = 1.0f;
  float host;
  reduce::kernelFor(DataType::Float32, ReduceOp::Sum)(&host, &signallingNaN, &one, 1);
  EXPECT_EQ(toBits(R::apply(signallingNaN, one)), toBits(host));
  EXPECT_EQ(toBits(R::apply(signallingNaN, one)), 0xffc12345u);
  const float minusInf = -inf;
  reduce::kernelFor(DataType::Float32, ReduceOp::Sum)(&host, &inf, &minusInf, 1);
  EXPECT_EQ(toBits(R::apply(inf, -inf)), toBits(host));
  const float zero = 0.0f;
  reduce::kernelFor(DataType::Float32, ReduceOp::Prod)(&host, &zero, &inf, 1);
  EXPECT_EQ(toBits(P::apply(zero, inf)), toBits(host));
}

// ---- Avg's finalize ----

TEST(DeviceKernels, AvgFinalizeMatchesHostFinalizeAtDivisors2357) {
  for (DataType type : kAllTypes) {
    visitReduction(type, ReduceOp::Avg, [&](auto reduction) {
      using R = decltype(reduction);
      using T = typename R::Storage;
      const Pairs pairs = pairsFor(type);  // both halves: specials and random values
      std::vector<T> values;
      for (uint64_t v : pairs.a) values.push_back(fromBits<T>(v));
      for (uint64_t v : pairs.b) values.push_back(fromBits<T>(v));
      for (int divisor : {2, 3, 5, 7}) {
        std::vector<T> host = values;
        reduce::finalize(host.data(), host.size(), type, ReduceOp::Avg, divisor);
        Mismatches mismatches(std::string(nameOf(type)) + " avg / " + std::to_string(divisor));
        for (size_t i = 0; i < values.size(); ++i) {
          const uint64_t got = toBits(R::finalize(values[i], divisor));
          if (got != toBits(host[i])) {
            mismatches.add(hex(toBits(values[i])) + ": host " + hex(toBits(host[i])) + ", device " +
                           hex(got));
          }
        }
      }
    });
  }
}

TEST(DeviceKernels, FinalizeWithDivisorBelowTwoLeavesTheBitsUnchanged) {
  for (DataType type : kAllTypes) {
    visitReduction(type, ReduceOp::Avg, [&](auto reduction) {
      using R = decltype(reduction);
      using T = typename R::Storage;
      Mismatches mismatches(nameOf(type));
      for (uint64_t bits : specialsOf(type)) {
        const T v = fromBits<T>(bits);
        for (int divisor : {0, 1}) {
          if (toBits(R::finalize(v, divisor)) != toBits(v)) mismatches.add(hex(bits));
        }
      }
    });
  }
}

// ---- n inputs: the reference ----

// The reference fold's result, and whether it met two NaN operands of Sum
// or Prod (then any NaN is right).
struct Folded {
  uint64_t bits = 0;
  bool eitherNaN = false;
};

template <typename T>
uint64_t referenceIntegerFold(ReduceOp op, const std::vector<uint64_t>& inputs) {
  // Sum and Prod in 64-bit unsigned arithmetic, which wraps modulo 2^64 and
  // so modulo 2^bits; Max and Min on the declared type.
  uint64_t wide = inputs[0];
  T value = fromBits<T>(inputs[0]);
  for (size_t i = 1; i < inputs.size(); ++i) {
    const T x = fromBits<T>(inputs[i]);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        wide += inputs[i];
        break;
      case ReduceOp::Prod:
        wide *= inputs[i];
        break;
      case ReduceOp::Max:
        if (x > value) value = x;
        break;
      case ReduceOp::Min:
        if (x < value) value = x;
        break;
    }
  }
  const bool combined = op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Prod;
  return combined ? wide & (sizeof(T) == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * sizeof(T))) - 1)
                  : toBits(value);
}

// IEEE 754-2019 maximum and minimum from the definition.
template <typename F>
F referenceMaximum(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? b : a;  // +0 over -0
  return a > b ? a : b;
}

template <typename F>
F referenceMinimum(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? a : b;  // -0 over +0
  return a < b ? a : b;
}

// Folds widened values left to right with plain C++ operators.
template <typename F>
F referenceFloatFold(ReduceOp op, const std::vector<F>& values, bool* eitherNaN) {
  F acc = values[0];
  for (size_t i = 1; i < values.size(); ++i) {
    const F x = values[i];
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        *eitherNaN = *eitherNaN || (std::isnan(acc) && std::isnan(x));
        acc = acc + x;
        break;
      case ReduceOp::Prod:
        *eitherNaN = *eitherNaN || (std::isnan(acc) && std::isnan(x));
        acc = acc * x;
        break;
      case ReduceOp::Max:
        acc = referenceMaximum(acc, x);
        break;
      case ReduceOp::Min:
        acc = referenceMinimum(acc, x);
        break;
    }
  }
  return acc;
}

// A narrow type: widen each input with the host conversion, fold in fp32,
// round once with the host conversion.
template <typename S>
Folded referenceNarrowFold(ReduceOp op, const std::vector<uint64_t>& inputs, float (*widen)(S),
                           S (*narrow)(float)) {
  std::vector<float> values;
  values.reserve(inputs.size());
  for (uint64_t v : inputs) values.push_back(widen(static_cast<S>(v)));
  Folded folded;
  folded.bits = narrow(referenceFloatFold(op, values, &folded.eitherNaN));
  return folded;
}

template <typename F>
Folded referenceWideFold(ReduceOp op, const std::vector<uint64_t>& inputs) {
  std::vector<F> values;
  values.reserve(inputs.size());
  for (uint64_t v : inputs) values.push_back(fromBits<F>(v));
  Folded folded;
  folded.bits = toBits(referenceFloatFold(op, values, &folded.eitherNaN));
  return folded;
}

Folded referenceFold(DataType type, ReduceOp op, const std::vector<uint64_t>& inputs) {
  switch (type) {
    case DataType::Int8:
      return {referenceIntegerFold<int8_t>(op, inputs)};
    case DataType::Uint8:
      return {referenceIntegerFold<uint8_t>(op, inputs)};
    case DataType::Int32:
      return {referenceIntegerFold<int32_t>(op, inputs)};
    case DataType::Uint32:
      return {referenceIntegerFold<uint32_t>(op, inputs)};
    case DataType::Int64:
      return {referenceIntegerFold<int64_t>(op, inputs)};
    case DataType::Uint64:
      return {referenceIntegerFold<uint64_t>(op, inputs)};
    case DataType::Float16:
      return referenceNarrowFold<uint16_t>(op, inputs, reduce::halfToFloat, reduce::floatToHalf);
    case DataType::Float32:
      return referenceWideFold<float>(op, inputs);
    case DataType::Float64:
      return referenceWideFold<double>(op, inputs);
    case DataType::BFloat16:
      return referenceNarrowFold<uint16_t>(op, inputs, reduce::bf16ToFloat, reduce::floatToBf16);
    case DataType::Float8E4M3:
      return referenceNarrowFold<uint8_t>(op, inputs, reduce::fp8e4m3ToFloat,
                                          reduce::floatToFp8e4m3);
    case DataType::Float8E5M2:
      return referenceNarrowFold<uint8_t>(op, inputs, reduce::fp8e5m2ToFloat,
                                          reduce::floatToFp8e5m2);
  }
  return {};
}

// n inputs: half of the tuples independent values, half values near one
// another (so that narrow sums round differently if rounded per step).
std::vector<std::vector<uint64_t>> tuplesFor(DataType type, int n) {
  const std::vector<uint64_t> specials = specialsOf(type);
  std::mt19937_64 rng(0xf01d0000u + 16u * static_cast<unsigned>(type) + static_cast<unsigned>(n));
  std::vector<std::vector<uint64_t>> tuples;
  for (int t = 0; t < 6000; ++t) {
    std::vector<uint64_t> tuple;
    tuple.reserve(n);
    const uint64_t base = rng() & maskOf(type);
    for (int k = 0; k < n; ++k) {
      tuple.push_back(t % 2 == 0 ? randomValue(type, specials, rng) : nearValue(type, base, rng));
    }
    tuples.push_back(tuple);
  }
  return tuples;
}

constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                                ReduceOp::Avg};

TEST(DeviceKernels, NInputFoldMatchesLeftToRightReferenceRoundedOnceForEveryTypeAndOp) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      visitReduction(type, op, [&](auto reduction) {
        using R = decltype(reduction);
        using T = typename R::Storage;
        Mismatches mismatches(std::string(nameOf(type)) + " " + nameOf(op) + " fold");
        for (int n = 3; n <= kMaxReduceInputs; ++n) {
          for (const std::vector<uint64_t>& tuple : tuplesFor(type, n)) {
            T values[kMaxReduceInputs];
            for (int k = 0; k < n; ++k) values[k] = fromBits<T>(tuple[k]);
            Folded expected = referenceFold(type, op, tuple);
            T got = R::fold(values, n);
            if (op == ReduceOp::Avg) {  // then divide by the number of inputs
              T divided = fromBits<T>(expected.bits);
              reduce::finalize(&divided, 1, type, op, n);
              expected.bits = toBits(divided);
              got = R::finalize(got, n);
            }
            const uint64_t gotBits = toBits(got);
            const bool bothNaN = isNaNPattern(type, gotBits) && isNaNPattern(type, expected.bits);
            if (gotBits != expected.bits && !(expected.eitherNaN && bothNaN)) {
              std::string inputs;
              for (uint64_t v : tuple) inputs += hex(v) + " ";
              mismatches.add("n = " + std::to_string(n) + ", inputs " + inputs + ": reference " +
                             hex(expected.bits) + ", fold " + hex(gotBits));
            }
          }
        }
      });
    }
  }
}

// Folding in fp32 and rounding once differs from rounding after each step:
// in fp16, 2048 + 1 + 1 is 2050, while (2048 + 1) rounds back to 2048.
TEST(DeviceKernels, NarrowFoldRoundsOnceAtTheEnd) {
  using R = Reduction<Float16Format, SumOp>;
  const uint16_t values[3] = {0x6800 /* 2048 */, 0x3c00 /* 1 */, 0x3c00};
  EXPECT_EQ(R::fold(values, 3), 0x6801 /* 2050 */);
  EXPECT_EQ(R::apply(R::apply(values[0], values[1]), values[2]), 0x6800 /* 2048 */);
}

TEST(DeviceKernels, SingleInputIsABitCopyForEveryType) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      visitReduction(type, op, [&](auto reduction) {
        using R = decltype(reduction);
        using T = typename R::Storage;
        Mismatches mismatches(std::string(nameOf(type)) + " " + nameOf(op));
        for (uint64_t bits : specialsOf(type)) {
          const T v = fromBits<T>(bits);
          if (toBits(R::fold(&v, 1)) != bits) mismatches.add(hex(bits));
        }
      });
    }
  }
}

TEST(DeviceKernels, VisitReductionRejectsOutOfRangeTypeOrOp) {
  int calls = 0;
  EXPECT_FALSE(visitReduction(static_cast<DataType>(12), ReduceOp::Sum, [&](auto) { ++calls; }));
  EXPECT_FALSE(visitReduction(DataType::Float32, static_cast<ReduceOp>(5), [&](auto) { ++calls; }));
  EXPECT_EQ(calls, 0);
}

// ---- Conversions ----

TEST(DeviceKernels, NarrowFloatWideningMatchesHostOnEveryPattern) {
  Mismatches mismatches("widen");
  for (uint32_t v = 0; v <= 0xffff; ++v) {
    const auto h = static_cast<uint16_t>(v);
    if (bitsOf(halfToFloat(h)) != bitsOf(reduce::halfToFloat(h))) mismatches.add("fp16 " + hex(v));
    if (bitsOf(bf16ToFloat(h)) != bitsOf(reduce::bf16ToFloat(h))) mismatches.add("bf16 " + hex(v));
  }
  for (uint32_t v = 0; v <= 0xff; ++v) {
    const auto b = static_cast<uint8_t>(v);
    if (bitsOf(fp8e4m3ToFloat(b)) != bitsOf(reduce::fp8e4m3ToFloat(b))) {
      mismatches.add("e4m3 " + hex(v));
    }
    if (bitsOf(fp8e5m2ToFloat(b)) != bitsOf(reduce::fp8e5m2ToFloat(b))) {
      mismatches.add("e5m2 " + hex(v));
    }
  }
}

// Every fp32 with the top `keptBits` fraction bits of any value and the
// rest one of the rounding cases (zero, one, just below, at and just above
// half, all ones), every midpoint between neighbouring values of the format
// and its fp32 neighbours, and random patterns: narrowing matches the host.
template <typename S>
void checkNarrowing(const char* name, int keptBits, S (*device)(float), S (*host)(float),
                    float (*hostWiden)(S)) {
  Mismatches mismatches(std::string("narrow to ") + name);
  const int dropped = 23 - keptBits;
  const uint32_t half = 1u << (dropped - 1);
  const uint32_t lows[] = {0, 1, half - 1, half, half + 1, (1u << dropped) - 1};
  auto check = [&](uint32_t u) {
    const float f = floatFromBits(u);
    if (device(f) != host(f)) {
      mismatches.add(hex(u) + ": host " + hex(host(f)) + ", device " + hex(device(f)));
    }
  };
  for (uint32_t top = 0; top < (1u << (9 + keptBits)); ++top) {
    for (uint32_t low : lows) check((top << dropped) | low);
  }
  // The midpoint between each two neighbouring finite values of the format
  // (subnormals included; exact in fp32), and the fp32 values next to it.
  const uint32_t codes = 1u << (8 * sizeof(S) - 1);  // magnitude codes
  for (uint32_t c = 0; c + 1 < codes; ++c) {
    const float lo = hostWiden(static_cast<S>(c));
    const float hi = hostWiden(static_cast<S>(c + 1));
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      check(bitsOf(f));
      check(bitsOf(-f));
    }
  }
  std::mt19937 rng(0xc0ffee);
  for (int i = 0; i < 1000000; ++i) check(static_cast<uint32_t>(rng()));
}

TEST(DeviceKernels, NarrowingFromFloat32MatchesHostOnEveryRoundingCase) {
  checkNarrowing<uint16_t>("fp16", 10, floatToHalf, reduce::floatToHalf, reduce::halfToFloat);
  checkNarrowing<uint16_t>("bf16", 7, floatToBf16, reduce::floatToBf16, reduce::bf16ToFloat);
  checkNarrowing<uint8_t>("e4m3", 3, floatToFp8e4m3, reduce::floatToFp8e4m3,
                          reduce::fp8e4m3ToFloat);
  checkNarrowing<uint8_t>("e5m2", 2, floatToFp8e5m2, reduce::floatToFp8e5m2,
                          reduce::fp8e5m2ToFloat);
}

}  // namespace
}  // namespace braid::device::cuda
