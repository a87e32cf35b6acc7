// Tests for the host reduction kernels and narrow-float conversions in
// src/reduce/reduce.h.
//
// Every expected value is computed independently of the code under test:
// integers in 128-bit arithmetic; floating-point types by decoding each bit
// pattern with ldexp, combining in double, and rounding with nearbyint at the
// target format's quantum (never with the bit tricks being tested).
//
// Floating-point kernel results are compared exactly with round(combine in
// double), not within half an ulp: the kernels round through fp32 (24 bits)
// and the reference through double (53 bits), and for +, * and / a first
// rounding to p' >= 2p + 2 bits never changes the final rounding to p bits
// (p <= 11 for the narrow types, 24 for fp32 via double). So any difference
// is a bug, not a rounding artefact.
#include "reduce/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "reduce/streaming.h"

namespace braid::reduce {
namespace {

constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                                ReduceOp::Avg};

constexpr DataType kAllTypes[] = {
    DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
    DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
    DataType::Float64, DataType::BFloat16, DataType::Float8E4M3, DataType::Float8E5M2,
};

// Local names and sizes, indexed by the enum values (types.h's dataTypeName()
// and dataTypeSize() live in another file).
constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};
constexpr const char* kTypeNames[] = {"int8",    "uint8",    "int32",      "uint32",
                                      "int64",   "uint64",   "float16",    "float32",
                                      "float64", "bfloat16", "float8e4m3", "float8e5m2"};
constexpr size_t kTypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

const char* nameOf(ReduceOp op) { return kOpNames[static_cast<int>(op)]; }
const char* nameOf(DataType type) { return kTypeNames[static_cast<int>(type)]; }
size_t sizeOf(DataType type) { return kTypeSizes[static_cast<int>(type)]; }

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Equal as values, with NaN equal to NaN and -0 distinct from +0.
bool sameValue(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return x == y && std::signbit(x) == std::signbit(y);
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

template <typename T>
using SameSizeUint =
    std::conditional_t<sizeof(T) == 1, uint8_t,
                       std::conditional_t<sizeof(T) == 2, uint16_t,
                                          std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;

template <typename T>
uint64_t bitsOf(T v) {
  SameSizeUint<T> u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

template <typename T>
T fromBits(uint64_t bits) {
  const auto u = static_cast<SameSizeUint<T>>(bits);
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

template <typename T>
std::vector<T> runKernel(DataType type, ReduceOp op, const std::vector<T>& a,
                         const std::vector<T>& b) {
  std::vector<T> dst(a.size());
  const Kernel kernel = kernelFor(type, op);
  kernel(dst.data(), a.data(), b.data(), a.size());
  return dst;
}

template <typename T>
struct Operands {
  std::vector<T> a;
  std::vector<T> b;
  void add(T x, T y) {
    a.push_back(x);
    b.push_back(y);
  }
  void addAllPairs(const std::vector<T>& xs) {
    for (T x : xs) {
      for (T y : xs) add(x, y);
    }
  }
};

// ---- Floating-point formats, described by their parameters only ----

enum class Overflow { kToInfinity, kSaturate };

struct Format {
  DataType type;
  int expBits;
  int fracBits;
  bool ieeeSpecials;  // exponent all ones is inf/NaN; else (E4M3) only S.1..1.1..1 is NaN
  Overflow overflow;  // beyond the largest finite value
  double maxFinite;   // from the format's specification, as a cross-check

  int bias() const { return (1 << (expBits - 1)) - 1; }
  int width() const { return 1 + expBits + fracBits; }
  uint64_t signBit() const { return uint64_t{1} << (expBits + fracBits); }
  uint64_t magnitudeMask() const { return signBit() - 1; }
  uint64_t fracMask() const { return (uint64_t{1} << fracBits) - 1; }
  uint64_t expAllOnes() const { return ((uint64_t{1} << expBits) - 1) << fracBits; }
  uint64_t maxFiniteCode() const { return ieeeSpecials ? expAllOnes() - 1 : magnitudeMask() - 1; }
  const char* name() const { return nameOf(type); }
};

const Format kFloat16{DataType::Float16, 5, 10, true, Overflow::kToInfinity, 65504.0};
// bfloat16's largest finite value is (2 - 2^-7) * 2^127.
const Format kBFloat16{DataType::BFloat16, 8, 7, true, Overflow::kToInfinity, 0x1.fep127};
const Format kE4M3{DataType::Float8E4M3, 4, 3, false, Overflow::kSaturate, 448.0};
const Format kE5M2{DataType::Float8E5M2, 5, 2, true, Overflow::kSaturate, 57344.0};
const Format kFloat32{
    DataType::Float32, 8, 23, true, Overflow::kToInfinity, std::numeric_limits<float>::max()};
const Format kFloat64{
    DataType::Float64, 11, 52, true, Overflow::kToInfinity, std::numeric_limits<double>::max()};

const Format* formatOf(DataType type) {
  switch (type) {
    case DataType::Float16:
      return &kFloat16;
    case DataType::BFloat16:
      return &kBFloat16;
    case DataType::Float8E4M3:
      return &kE4M3;
    case DataType::Float8E5M2:
      return &kE5M2;
    case DataType::Float32:
      return &kFloat32;
    case DataType::Float64:
      return &kFloat64;
    default:
      return nullptr;
  }
}

bool isNanCode(const Format& f, uint64_t bits) {
  const uint64_t mag = bits & f.magnitudeMask();
  return f.ieeeSpecials ? mag > f.expAllOnes() : mag == f.magnitudeMask();
}

// The exact value of a bit pattern.
double decode(const Format& f, uint64_t bits) {
  const double sign = (bits & f.signBit()) != 0 ? -1.0 : 1.0;
  const uint64_t e = (bits >> f.fracBits) & ((uint64_t{1} << f.expBits) - 1);
  const uint64_t m = bits & f.fracMask();
  if (isNanCode(f, bits)) return std::numeric_limits<double>::quiet_NaN();
  if (f.ieeeSpecials && (bits & f.magnitudeMask()) == f.expAllOnes()) {
    return sign * std::numeric_limits<double>::infinity();
  }
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - f.bias() - f.fracBits);
  return sign * std::ldexp(static_cast<double>(m + (uint64_t{1} << f.fracBits)),
                           static_cast<int>(e) - f.bias() - f.fracBits);
}

// x rounded to nearest even in the format, as the value it represents.
double roundTo(const Format& f, double x) {
  if (std::isnan(x) || x == 0) return x;
  const double inf = std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return f.ieeeSpecials ? x : std::copysign(f.maxFinite, x);
  int e;
  std::frexp(std::fabs(x), &e);  // |x| = m * 2^e with m in [0.5, 1)
  const int exponent = std::max(e - 1, 1 - f.bias());
  const int quantum = exponent - f.fracBits;  // the ulp at |x|, or the subnormal step
  const double r = std::ldexp(std::nearbyint(std::ldexp(std::fabs(x), -quantum)), quantum);
  if (r > f.maxFinite) {
    return std::copysign(f.overflow == Overflow::kToInfinity ? inf : f.maxFinite, x);
  }
  return std::copysign(r, x);
}

std::vector<uint64_t> edgePatterns(const Format& f) {
  const uint64_t one = static_cast<uint64_t>(f.bias()) << f.fracBits;
  const uint64_t minNormal = f.fracMask() + 1;
  std::vector<uint64_t> magnitudes = {
      0,                      // zero
      1,                      // smallest subnormal
      2,                      // second subnormal
      3,                      //
      f.fracMask(),           // largest subnormal
      minNormal,              // smallest normal
      minNormal + 1,          //
      one - 1,                // just below 1
      one,                    // 1
      one + 1,                // just above 1
      one + minNormal,        // 2
      one + (minNormal / 2),  // 1.5
      f.maxFiniteCode() - 1,  //
      f.maxFiniteCode(),      // largest finite
  };
  if (f.ieeeSpecials) {
    magnitudes.push_back(f.expAllOnes());                                      // inf
    magnitudes.push_back(f.expAllOnes() | (uint64_t{1} << (f.fracBits - 1)));  // quiet NaN
    magnitudes.push_back(f.expAllOnes() | 1);                                  // signaling NaN
  } else {
    magnitudes.push_back(f.magnitudeMask());  // the only NaN
  }
  std::vector<uint64_t> out;
  for (uint64_t m : magnitudes) {
    out.push_back(m);
    out.push_back(m | f.signBit());
  }
  return out;
}

uint64_t randomPattern(const Format& f, std::mt19937_64& rng) {
  const int width = f.width();
  const uint64_t bits = rng();
  return width == 64 ? bits : bits & ((uint64_t{1} << width) - 1);
}

// A random value whose exponent field lies in [lo, hi].
uint64_t randomWithExponent(const Format& f, uint64_t lo, uint64_t hi, std::mt19937_64& rng) {
  const uint64_t e = std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  return (rng() & f.signBit()) | (e << f.fracBits) | (rng() & f.fracMask());
}

// Edge x edge pairs plus random pairs of three kinds: unrelated bit
// patterns, values of moderate magnitude, and neighbours (b a few codes from
// a, either sign), which exercise cancellation and rounding ties.
template <typename T>
Operands<T> floatOperands(const Format& f, uint64_t seed, int randomPairsPerKind) {
  std::mt19937_64 rng(seed);
  Operands<T> ops;
  std::vector<T> edges;
  for (uint64_t bits : edgePatterns(f)) edges.push_back(fromBits<T>(bits));
  ops.addAllPairs(edges);
  const uint64_t midExp = static_cast<uint64_t>(f.bias());
  const uint64_t spread = std::min<uint64_t>(midExp - 1, 20);
  for (int i = 0; i < randomPairsPerKind; ++i) {
    ops.add(fromBits<T>(randomPattern(f, rng)), fromBits<T>(randomPattern(f, rng)));
    ops.add(fromBits<T>(randomWithExponent(f, midExp - spread, midExp + spread, rng)),
            fromBits<T>(randomWithExponent(f, midExp - spread, midExp + spread, rng)));
    const uint64_t a = randomPattern(f, rng);
    const uint64_t delta = rng() % 4096;
    const uint64_t b = ((a & f.magnitudeMask()) + delta) & f.magnitudeMask();
    ops.add(fromBits<T>(a), fromBits<T>(b | (rng() & f.signBit())));
  }
  return ops;
}

// IEEE 754-2019 maximum/minimum: NaN if either is NaN, and -0 < +0.
double referenceMax(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

double referenceMin(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

double combineInDouble(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // the kernel combines like Sum; finalize() divides
      return a + b;
    case ReduceOp::Prod:
      return a * b;
    case ReduceOp::Max:
      return referenceMax(a, b);
    case ReduceOp::Min:
      return referenceMin(a, b);
  }
  return 0;
}

// Runs every op on (a, b) and checks each result against round(combine in
// double of the decoded operands).
template <typename T>
void expectFloatKernelsMatchReference(const Format& f, const Operands<T>& ops) {
  for (ReduceOp op : kAllOps) {
    const std::vector<T> got = runKernel(f.type, op, ops.a, ops.b);
    Mismatches bad(std::string(f.name()) + " " + nameOf(op));
    for (size_t i = 0; i < got.size(); ++i) {
      const double a = decode(f, bitsOf(ops.a[i]));
      const double b = decode(f, bitsOf(ops.b[i]));
      const double want = roundTo(f, combineInDouble(op, a, b));
      const double have = decode(f, bitsOf(got[i]));
      if (!sameValue(want, have)) {
        bad.add(hex(bitsOf(ops.a[i])) + " (" + std::to_string(a) + ") op " + hex(bitsOf(ops.b[i])) +
                " (" + std::to_string(b) + ") gave " + hex(bitsOf(got[i])) + " (" +
                std::to_string(have) + "), want " + std::to_string(want));
      }
    }
  }
}

// ---- Integers ----

template <typename T>
using Wide = std::conditional_t<std::is_signed_v<T>, __int128, unsigned __int128>;

template <typename T>
T referenceInteger(ReduceOp op, T a, T b) {
  const Wide<T> x = a;
  const Wide<T> y = b;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return static_cast<T>(x + y);  // truncation to T: modulo 2^bits
    case ReduceOp::Prod:
      return static_cast<T>(x * y);
    case ReduceOp::Max:
      return std::max(a, b);
    case ReduceOp::Min:
      return std::min(a, b);
  }
  return 0;
}

template <typename T>
std::vector<T> integerSamples(int randomCount, uint64_t seed) {
  using L = std::numeric_limits<T>;
  std::vector<T> v = {0,
                      1,
                      2,
                      3,
                      7,
                      L::max(),
                      static_cast<T>(L::max() - 1),
                      L::min(),
                      static_cast<T>(L::min() + 1),
                      static_cast<T>(L::max() / 2),
                      static_cast<T>(L::max() / 2 + 1),
                      static_cast<T>(0x5555555555555555ull)};
  if (std::is_signed_v<T>) {
    for (int x : {-1, -2, -3, -7}) v.push_back(static_cast<T>(x));
  }
  std::mt19937_64 rng(seed);
  for (int i = 0; i < randomCount; ++i) v.push_back(static_cast<T>(rng()));
  return v;
}

template <typename T>
void expectIntegerKernelsMatchReference(DataType type, const Operands<T>& ops) {
  for (ReduceOp op : kAllOps) {
    const std::vector<T> got = runKernel(type, op, ops.a, ops.b);
    Mismatches bad(std::string(nameOf(type)) + " " + nameOf(op));
    for (size_t i = 0; i < got.size(); ++i) {
      const T want = referenceInteger(op, ops.a[i], ops.b[i]);
      if (got[i] != want) {
        bad.add(std::to_string(+ops.a[i]) + " op " + std::to_string(+ops.b[i]) + " gave " +
                std::to_string(+got[i]) + ", want " + std::to_string(+want));
      }
    }
  }
}

template <typename T>
Operands<T> integerOperands(uint64_t seed) {
  Operands<T> ops;
  if (sizeof(T) == 1) {
    std::vector<T> all;
    for (int v = 0; v < 256; ++v) all.push_back(static_cast<T>(v));
    ops.addAllPairs(all);  // every pair
  } else {
    ops.addAllPairs(integerSamples<T>(300, seed));
  }
  return ops;
}

// ---- Type-erased helpers for tests that run over every DataType ----

// Equal bytes, or both NaN (which NaN a float op returns is not specified).
bool sameElement(DataType type, const unsigned char* x, const unsigned char* y) {
  const size_t size = sizeOf(type);
  if (std::memcmp(x, y, size) == 0) return true;
  const Format* f = formatOf(type);
  if (f == nullptr) return false;
  uint64_t bx = 0;
  uint64_t by = 0;
  std::memcpy(&bx, x, size);  // little-endian host
  std::memcpy(&by, y, size);
  return isNanCode(*f, bx) && isNanCode(*f, by);
}

// `count` elements of random bytes in storage aligned for any element type.
std::vector<uint64_t> randomBuffer(size_t count, DataType type, std::mt19937_64& rng) {
  std::vector<uint64_t> buffer((count * sizeOf(type) + 7) / 8 + 1);
  for (uint64_t& word : buffer) word = rng();
  return buffer;
}

unsigned char* bytes(std::vector<uint64_t>& buffer) {
  return reinterpret_cast<unsigned char*>(buffer.data());
}

// ======================= Kernel tests =======================

TEST(ReduceKernels, EveryTypeAndOpHasAKernel) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      EXPECT_NE(kernelFor(type, op), nullptr) << nameOf(type) << " " << nameOf(op);
    }
  }
}

TEST(ReduceKernels, OutOfRangeTypeOrOpHasNoKernel) {
  EXPECT_EQ(kernelFor(static_cast<DataType>(kNumDataTypes), ReduceOp::Sum), nullptr);
  EXPECT_EQ(kernelFor(static_cast<DataType>(-1), ReduceOp::Sum), nullptr);
  EXPECT_EQ(kernelFor(DataType::Float32, static_cast<ReduceOp>(kNumReduceOps)), nullptr);
}

TEST(ReduceKernels, Int8MatchesWideReferenceForEveryOpOnAllPairs) {
  expectIntegerKernelsMatchReference(DataType::Int8, integerOperands<int8_t>(1));
}

TEST(ReduceKernels, Uint8MatchesWideReferenceForEveryOpOnAllPairs) {
  expectIntegerKernelsMatchReference(DataType::Uint8, integerOperands<uint8_t>(2));
}

TEST(ReduceKernels, Int32MatchesWideReferenceForEveryOp) {
  expectIntegerKernelsMatchReference(DataType::Int32, integerOperands<int32_t>(3));
}

TEST(ReduceKernels, Uint32MatchesWideReferenceForEveryOp) {
  expectIntegerKernelsMatchReference(DataType::Uint32, integerOperands<uint32_t>(4));
}

TEST(ReduceKernels, Int64MatchesWideReferenceForEveryOp) {
  expectIntegerKernelsMatchReference(DataType::Int64, integerOperands<int64_t>(5));
}

TEST(ReduceKernels, Uint64MatchesWideReferenceForEveryOp) {
  expectIntegerKernelsMatchReference(DataType::Uint64, integerOperands<uint64_t>(6));
}

TEST(ReduceKernels, Int8SumWrapsModulo256) {
  const std::vector<int8_t> a = {127, -128, 100, -100};
  const std::vector<int8_t> b = {1, -1, 100, -100};
  EXPECT_EQ(runKernel(DataType::Int8, ReduceOp::Sum, a, b),
            (std::vector<int8_t>{-128, 127, -56, 56}));
}

TEST(ReduceKernels, IntegerProdWrapsModulo2ToTheBits) {
  EXPECT_EQ(runKernel(DataType::Int8, ReduceOp::Prod, std::vector<int8_t>{16, -128, 127},
                      std::vector<int8_t>{16, -1, 127}),
            (std::vector<int8_t>{0, -128, 1}));
  EXPECT_EQ(runKernel(DataType::Uint8, ReduceOp::Prod, std::vector<uint8_t>{255, 16},
                      std::vector<uint8_t>{255, 16}),
            (std::vector<uint8_t>{1, 0}));
  const int32_t int32Min = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(runKernel(DataType::Int32, ReduceOp::Prod, std::vector<int32_t>{int32Min, 65536},
                      std::vector<int32_t>{-1, 65536}),
            (std::vector<int32_t>{int32Min, 0}));
  const uint64_t uint64Max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(runKernel(DataType::Uint64, ReduceOp::Prod, std::vector<uint64_t>{uint64Max},
                      std::vector<uint64_t>{uint64Max}),
            (std::vector<uint64_t>{1}));
  const int64_t int64Max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(runKernel(DataType::Int64, ReduceOp::Sum, std::vector<int64_t>{int64Max},
                      std::vector<int64_t>{1}),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min()}));
}

TEST(ReduceKernels, SignedMaxAndMinCompareAsSigned) {
  EXPECT_EQ(runKernel(DataType::Int8, ReduceOp::Max, std::vector<int8_t>{-1, -128},
                      std::vector<int8_t>{1, 127}),
            (std::vector<int8_t>{1, 127}));
  EXPECT_EQ(
      runKernel(DataType::Int64, ReduceOp::Min, std::vector<int64_t>{-1}, std::vector<int64_t>{1}),
      (std::vector<int64_t>{-1}));
  EXPECT_EQ(runKernel(DataType::Uint32, ReduceOp::Max, std::vector<uint32_t>{0xffffffffu},
                      std::vector<uint32_t>{1}),
            (std::vector<uint32_t>{0xffffffffu}));
}

TEST(ReduceKernels, Float32MatchesRoundedDoubleReferenceForEveryOp) {
  expectFloatKernelsMatchReference(kFloat32, floatOperands<float>(kFloat32, 7, 20000));
}

TEST(ReduceKernels, Float64MatchesDoubleReferenceForEveryOp) {
  expectFloatKernelsMatchReference(kFloat64, floatOperands<double>(kFloat64, 8, 20000));
}

TEST(ReduceKernels, Float16MatchesRoundedDoubleReferenceForEveryOp) {
  expectFloatKernelsMatchReference(kFloat16, floatOperands<uint16_t>(kFloat16, 9, 20000));
}

TEST(ReduceKernels, BFloat16MatchesRoundedDoubleReferenceForEveryOp) {
  expectFloatKernelsMatchReference(kBFloat16, floatOperands<uint16_t>(kBFloat16, 10, 20000));
}

Operands<uint8_t> allBytePairs() {
  Operands<uint8_t> ops;
  std::vector<uint8_t> all;
  for (int v = 0; v < 256; ++v) all.push_back(static_cast<uint8_t>(v));
  ops.addAllPairs(all);
  return ops;
}

TEST(ReduceKernels, Float8E4M3MatchesRoundedDoubleReferenceForEveryOpOnAllPairs) {
  expectFloatKernelsMatchReference(kE4M3, allBytePairs());
}

TEST(ReduceKernels, Float8E5M2MatchesRoundedDoubleReferenceForEveryOpOnAllPairs) {
  expectFloatKernelsMatchReference(kE5M2, allBytePairs());
}

TEST(ReduceKernels, FloatMaxAndMinPropagateNaNFromEitherOperand) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> a = {nan, 1.0f, nan, -inf, inf};
  const std::vector<float> b = {1.0f, nan, nan, nan, nan};
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
    for (float r : runKernel(DataType::Float32, op, a, b)) EXPECT_TRUE(std::isnan(r)) << nameOf(op);
    const std::vector<double> ad(a.begin(), a.end());
    const std::vector<double> bd(b.begin(), b.end());
    for (double r : runKernel(DataType::Float64, op, ad, bd)) {
      EXPECT_TRUE(std::isnan(r)) << nameOf(op);
    }
  }
  // Narrow types: fp16 NaN (0x7e00) against 1.0 (0x3c00), both orders.
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
    const std::vector<uint16_t> got =
        runKernel(DataType::Float16, op, std::vector<uint16_t>{0x7e00, 0x3c00},
                  std::vector<uint16_t>{0x3c00, 0x7e00});
    for (uint16_t r : got) EXPECT_TRUE(isNanCode(kFloat16, r)) << nameOf(op) << " " << hex(r);
  }
}

TEST(ReduceKernels, FloatMaxPrefersPositiveZeroAndMinNegativeZeroInEitherOrder) {
  const std::vector<float> a = {0.0f, -0.0f};
  const std::vector<float> b = {-0.0f, 0.0f};
  for (float r : runKernel(DataType::Float32, ReduceOp::Max, a, b)) EXPECT_FALSE(std::signbit(r));
  for (float r : runKernel(DataType::Float32, ReduceOp::Min, a, b)) EXPECT_TRUE(std::signbit(r));
  EXPECT_EQ(runKernel(DataType::BFloat16, ReduceOp::Max, std::vector<uint16_t>{0x8000, 0x0000},
                      std::vector<uint16_t>{0x0000, 0x8000}),
            (std::vector<uint16_t>{0x0000, 0x0000}));
  EXPECT_EQ(runKernel(DataType::Float8E4M3, ReduceOp::Min, std::vector<uint8_t>{0x80, 0x00},
                      std::vector<uint8_t>{0x00, 0x80}),
            (std::vector<uint8_t>{0x80, 0x80}));
}

TEST(ReduceKernels, Float16SumOverflowsToInfinity) {
  // 65504 + 65504 and 65504 + 16 (= 65520, the tie between 65504 and 2^16).
  EXPECT_EQ(
      runKernel(DataType::Float16, ReduceOp::Sum, std::vector<uint16_t>{0x7bff, 0x7bff, 0xfbff},
                std::vector<uint16_t>{0x7bff, 0x4c00, 0xfbff}),
      (std::vector<uint16_t>{0x7c00, 0x7c00, 0xfc00}));
}

TEST(ReduceKernels, Float8SumSaturatesAtLargestFinite) {
  // E4M3: 448 + 448 -> 448, -448 + -448 -> -448.
  EXPECT_EQ(runKernel(DataType::Float8E4M3, ReduceOp::Sum, std::vector<uint8_t>{0x7e, 0xfe},
                      std::vector<uint8_t>{0x7e, 0xfe}),
            (std::vector<uint8_t>{0x7e, 0xfe}));
  // E5M2: 57344 + 57344 -> 57344, but inf + 1 stays inf and inf + -inf is NaN.
  const std::vector<uint8_t> got =
      runKernel(DataType::Float8E5M2, ReduceOp::Sum, std::vector<uint8_t>{0x7b, 0x7c, 0x7c},
                std::vector<uint8_t>{0x7b, 0x3c, 0xfc});
  EXPECT_EQ(got[0], 0x7b);
  EXPECT_EQ(got[1], 0x7c);
  EXPECT_TRUE(isNanCode(kE5M2, got[2])) << hex(got[2]);
}

TEST(ReduceKernels, NarrowSumRoundsOnceToNearestEven) {
  // fp16: 1 + 2^-11 is the tie between 1 and 1 + 2^-10: even is 1.
  // 1 + 2^-10 + 2^-11 (two operands, one rounding) is the tie between 1 + 2^-10 and 1 + 2^-9.
  EXPECT_EQ(runKernel(DataType::Float16, ReduceOp::Sum, std::vector<uint16_t>{0x3c00, 0x3c01},
                      std::vector<uint16_t>{0x1000, 0x1000}),
            (std::vector<uint16_t>{0x3c00, 0x3c02}));
}

TEST(ReduceKernels, AvgCombinesLikeSumForEveryType) {
  std::mt19937_64 rng(11);
  constexpr size_t kCount = 1000;
  for (DataType type : kAllTypes) {
    std::vector<uint64_t> a = randomBuffer(kCount, type, rng);
    std::vector<uint64_t> b = randomBuffer(kCount, type, rng);
    std::vector<uint64_t> sum(a.size());
    std::vector<uint64_t> avg(a.size());
    kernelFor(type, ReduceOp::Sum)(sum.data(), a.data(), b.data(), kCount);
    kernelFor(type, ReduceOp::Avg)(avg.data(), a.data(), b.data(), kCount);
    for (size_t i = 0; i < kCount; ++i) {
      const size_t offset = i * sizeOf(type);
      EXPECT_TRUE(sameElement(type, bytes(sum) + offset, bytes(avg) + offset))
          << nameOf(type) << " element " << i;
    }
  }
}

TEST(ReduceKernels, InPlaceIntoEitherOperandMatchesOutOfPlace) {
  std::mt19937_64 rng(12);
  constexpr size_t kCount = 1031;  // not a multiple of any vector width
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(std::string(nameOf(type)) + " " + nameOf(op));
      const Kernel kernel = kernelFor(type, op);
      std::vector<uint64_t> a = randomBuffer(kCount, type, rng);
      std::vector<uint64_t> b = randomBuffer(kCount, type, rng);
      std::vector<uint64_t> expected(a.size());
      kernel(expected.data(), a.data(), b.data(), kCount);
      std::vector<uint64_t> expectedSelf(a.size());
      kernel(expectedSelf.data(), a.data(), a.data(), kCount);

      std::vector<uint64_t> intoA = a;
      kernel(intoA.data(), intoA.data(), b.data(), kCount);
      std::vector<uint64_t> intoB = b;
      kernel(intoB.data(), a.data(), intoB.data(), kCount);
      std::vector<uint64_t> intoBoth = a;
      kernel(intoBoth.data(), intoBoth.data(), intoBoth.data(), kCount);

      int bad = 0;
      for (size_t i = 0; i < kCount; ++i) {
        const size_t offset = i * sizeOf(type);
        bad += !sameElement(type, bytes(expected) + offset, bytes(intoA) + offset);
        bad += !sameElement(type, bytes(expected) + offset, bytes(intoB) + offset);
        bad += !sameElement(type, bytes(expectedSelf) + offset, bytes(intoBoth) + offset);
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(ReduceKernels, WritesExactlyCountElementsForEveryTailLength) {
  std::mt19937_64 rng(13);
  constexpr size_t kMaxCount = 70;
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(std::string(nameOf(type)) + " " + nameOf(op));
      const Kernel kernel = kernelFor(type, op);
      const size_t size = sizeOf(type);
      std::vector<uint64_t> a = randomBuffer(kMaxCount, type, rng);
      std::vector<uint64_t> b = randomBuffer(kMaxCount, type, rng);
      std::vector<uint64_t> full(a.size());
      kernel(full.data(), a.data(), b.data(), kMaxCount);
      for (size_t count = 0; count < kMaxCount; ++count) {
        std::vector<uint64_t> dst(a.size(), 0xa5a5a5a5a5a5a5a5ull);
        kernel(dst.data(), a.data(), b.data(), count);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(sameElement(type, bytes(full) + i * size, bytes(dst) + i * size))
              << "count " << count << " element " << i;
        }
        for (size_t byte = count * size; byte < dst.size() * 8; ++byte) {
          ASSERT_EQ(bytes(dst)[byte], 0xa5) << "count " << count << " wrote byte " << byte;
        }
      }
    }
  }
}

TEST(ReduceKernels, ZeroCountTouchesNothing) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) kernelFor(type, op)(nullptr, nullptr, nullptr, 0);
  }
}

// ======================= finalize() =======================

template <typename T>
void expectIntegerAvgTruncatesTowardZero(DataType type) {
  std::vector<T> values = integerSamples<T>(300, 14);
  for (int divisor : {2, 3, 7, 8, 1000}) {
    std::vector<T> got = values;
    finalize(got.data(), got.size(), type, ReduceOp::Avg, divisor);
    Mismatches bad(std::string(nameOf(type)) + " / " + std::to_string(divisor));
    for (size_t i = 0; i < values.size(); ++i) {
      const T want = static_cast<T>(static_cast<Wide<T>>(values[i]) / divisor);
      if (got[i] != want) {
        bad.add(std::to_string(+values[i]) + " gave " + std::to_string(+got[i]) + ", want " +
                std::to_string(+want));
      }
    }
  }
}

TEST(ReduceFinalize, IntegerAvgTruncatesTowardZero) {
  std::vector<int8_t> int8 = {-7, 7, -1, 1, -128, 127, 0};
  finalize(int8.data(), int8.size(), DataType::Int8, ReduceOp::Avg, 2);
  EXPECT_EQ(int8, (std::vector<int8_t>{-3, 3, 0, 0, -64, 63, 0}));
  std::vector<int32_t> int32 = {-7, -8, -9};
  finalize(int32.data(), int32.size(), DataType::Int32, ReduceOp::Avg, 3);
  EXPECT_EQ(int32, (std::vector<int32_t>{-2, -2, -3}));
  std::vector<uint8_t> uint8 = {255, 7};
  finalize(uint8.data(), uint8.size(), DataType::Uint8, ReduceOp::Avg, 2);
  EXPECT_EQ(uint8, (std::vector<uint8_t>{127, 3}));

  expectIntegerAvgTruncatesTowardZero<int8_t>(DataType::Int8);
  expectIntegerAvgTruncatesTowardZero<uint8_t>(DataType::Uint8);
  expectIntegerAvgTruncatesTowardZero<int32_t>(DataType::Int32);
  expectIntegerAvgTruncatesTowardZero<uint32_t>(DataType::Uint32);
  expectIntegerAvgTruncatesTowardZero<int64_t>(DataType::Int64);
  expectIntegerAvgTruncatesTowardZero<uint64_t>(DataType::Uint64);
}

template <typename T>
void expectFloatAvgDividesAndRoundsOnce(const Format& f, const std::vector<T>& values) {
  for (int divisor : {2, 3, 7, 10}) {
    std::vector<T> got = values;
    finalize(got.data(), got.size(), f.type, ReduceOp::Avg, divisor);
    Mismatches bad(std::string(f.name()) + " / " + std::to_string(divisor));
    for (size_t i = 0; i < values.size(); ++i) {
      const double want = roundTo(f, decode(f, bitsOf(values[i])) / divisor);
      const double have = decode(f, bitsOf(got[i]));
      if (!sameValue(want, have)) {
        bad.add(hex(bitsOf(values[i])) + " gave " + hex(bitsOf(got[i])) + " (" +
                std::to_string(have) + "), want " + std::to_string(want));
      }
    }
  }
}

template <typename T>
std::vector<T> everyPattern() {
  std::vector<T> all;
  for (uint64_t bits = 0; bits <= std::numeric_limits<T>::max(); ++bits) {
    all.push_back(static_cast<T>(bits));
  }
  return all;
}

template <typename T>
std::vector<T> floatSamples(const Format& f, uint64_t seed) {
  const Operands<T> ops = floatOperands<T>(f, seed, 5000);
  std::vector<T> values = ops.a;
  values.insert(values.end(), ops.b.begin(), ops.b.end());
  return values;
}

TEST(ReduceFinalize, FloatAvgDividesAndRoundsOnceToNearestEven) {
  expectFloatAvgDividesAndRoundsOnce(kFloat16, everyPattern<uint16_t>());
  expectFloatAvgDividesAndRoundsOnce(kBFloat16, everyPattern<uint16_t>());
  expectFloatAvgDividesAndRoundsOnce(kE4M3, everyPattern<uint8_t>());
  expectFloatAvgDividesAndRoundsOnce(kE5M2, everyPattern<uint8_t>());
  expectFloatAvgDividesAndRoundsOnce(kFloat32, floatSamples<float>(kFloat32, 15));
  expectFloatAvgDividesAndRoundsOnce(kFloat64, floatSamples<double>(kFloat64, 16));

  std::vector<float> f32 = {1.0f, -7.0f};
  finalize(f32.data(), f32.size(), DataType::Float32, ReduceOp::Avg, 3);
  EXPECT_EQ(f32, (std::vector<float>{1.0f / 3.0f, -7.0f / 3.0f}));
}

TEST(ReduceFinalize, IsANoOpForEveryOpButAvg) {
  std::mt19937_64 rng(17);
  constexpr size_t kCount = 257;
  for (DataType type : kAllTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min}) {
      const std::vector<uint64_t> before = randomBuffer(kCount, type, rng);
      std::vector<uint64_t> after = before;
      finalize(after.data(), kCount, type, op, 5);
      EXPECT_EQ(after, before) << nameOf(type) << " " << nameOf(op);
    }
  }
}

TEST(ReduceFinalize, AvgOverOneRankLeavesDataUnchanged) {
  std::mt19937_64 rng(18);
  for (DataType type : kAllTypes) {
    const std::vector<uint64_t> before = randomBuffer(100, type, rng);
    std::vector<uint64_t> after = before;
    finalize(after.data(), 100, type, ReduceOp::Avg, 1);
    EXPECT_EQ(after, before) << nameOf(type);
  }
}

TEST(ReduceFinalize, AvgKernelThenFinalizeAveragesRanks) {
  // Three ranks contributing 1, 2 and 4 (int32) and 1.5, 2.5, 3.5 (fp16).
  std::vector<int32_t> acc = {1};
  const Kernel intAvg = kernelFor(DataType::Int32, ReduceOp::Avg);
  for (int32_t v : {2, 4}) intAvg(acc.data(), acc.data(), &v, 1);
  finalize(acc.data(), 1, DataType::Int32, ReduceOp::Avg, 3);
  EXPECT_EQ(acc[0], 2);  // 7 / 3

  std::vector<uint16_t> half = {0x3e00};  // 1.5
  const Kernel halfAvg = kernelFor(DataType::Float16, ReduceOp::Avg);
  for (uint16_t v : {uint16_t{0x4100}, uint16_t{0x4300}}) halfAvg(half.data(), half.data(), &v, 1);
  finalize(half.data(), 1, DataType::Float16, ReduceOp::Avg, 3);
  EXPECT_EQ(half[0], 0x4100);  // 7.5 / 3 = 2.5
}

// ======================= Conversions =======================

struct Converter {
  const Format* format;
  float (*widen)(uint64_t bits);
  uint64_t (*narrow)(float f);
};

const Converter kConverters[] = {
    {&kFloat16, [](uint64_t v) { return halfToFloat(static_cast<uint16_t>(v)); },
     [](float f) -> uint64_t { return floatToHalf(f); }},
    {&kBFloat16, [](uint64_t v) { return bf16ToFloat(static_cast<uint16_t>(v)); },
     [](float f) -> uint64_t { return floatToBf16(f); }},
    {&kE4M3, [](uint64_t v) { return fp8e4m3ToFloat(static_cast<uint8_t>(v)); },
     [](float f) -> uint64_t { return floatToFp8e4m3(f); }},
    {&kE5M2, [](uint64_t v) { return fp8e5m2ToFloat(static_cast<uint8_t>(v)); },
     [](float f) -> uint64_t { return floatToFp8e5m2(f); }},
};

// A NaN result must be a quiet NaN (E4M3's only NaN is quiet by definition).
bool isQuietNanCode(const Format& f, uint64_t bits) {
  if (!isNanCode(f, bits)) return false;
  return !f.ieeeSpecials || (bits & (uint64_t{1} << (f.fracBits - 1))) != 0;
}

TEST(NarrowFloat, EveryBitPatternWidensExactlyAndNarrowsBackToItself) {
  for (const Converter& c : kConverters) {
    const Format& f = *c.format;
    Mismatches bad(f.name());
    for (uint64_t bits = 0; bits < (uint64_t{1} << f.width()); ++bits) {
      const float wide = c.widen(bits);
      if (!sameValue(decode(f, bits), wide)) {
        bad.add(hex(bits) + " widened to " + std::to_string(wide));
        continue;
      }
      const uint64_t back = c.narrow(wide);
      const bool ok = isNanCode(f, bits) ? isQuietNanCode(f, back) : back == bits;
      if (!ok) bad.add(hex(bits) + " came back as " + hex(back));
    }
  }
}

void expectNarrowingMatchesReference(const Converter& c, float x, Mismatches& bad) {
  const Format& f = *c.format;
  const uint64_t got = c.narrow(x);
  const double want = roundTo(f, x);
  const bool ok = std::isnan(want) ? isQuietNanCode(f, got) : sameValue(want, decode(f, got));
  if (!ok) {
    std::ostringstream detail;
    detail << std::hexfloat << x << " narrowed to " << hex(got) << " (" << decode(f, got)
           << "), want " << want;
    bad.add(detail.str());
  }
}

TEST(NarrowFloat, NarrowingMatchesDoubleReferenceOnRandomFloats) {
  std::mt19937_64 rng(19);
  for (const Converter& c : kConverters) {
    const Format& f = *c.format;
    Mismatches bad(f.name());
    // fp32 exponent fields that cover the format's range with a margin.
    const int lo = std::max(1, 127 - f.bias() - f.fracBits - 3);
    const int hi = std::min(254, 127 + f.bias() + 3);
    for (int i = 0; i < 200000; ++i) {
      expectNarrowingMatchesReference(c, fromBits<float>(rng() & 0xffffffffu), bad);
      expectNarrowingMatchesReference(c, fromBits<float>(randomWithExponent(kFloat32, lo, hi, rng)),
                                      bad);
    }
  }
}

TEST(NarrowFloat, NarrowingRoundsEveryHalfwayPointToEven) {
  for (const Converter& c : kConverters) {
    const Format& f = *c.format;
    Mismatches bad(f.name());
    for (uint64_t code = 0; code < f.maxFiniteCode(); ++code) {
      // The midpoint of two neighbours needs one bit more than the format:
      // exact in fp32 for every format here.
      const float mid = static_cast<float>((decode(f, code) + decode(f, code + 1)) / 2);
      const uint64_t even = (code & 1) == 0 ? code : code + 1;
      for (uint64_t sign : {uint64_t{0}, f.signBit()}) {
        const float x = sign != 0 ? -mid : mid;
        const uint64_t got = c.narrow(x);
        if (got != (even | sign)) bad.add("tie " + std::to_string(x) + " gave " + hex(got));
        const uint64_t below = c.narrow(std::nextafter(x, 0.0f));
        const uint64_t above = c.narrow(std::nextafter(x, x * 2));
        if (below != (code | sign) || above != ((code + 1) | sign)) {
          bad.add("near tie " + std::to_string(x) + " gave " + hex(below) + ", " + hex(above));
        }
      }
    }
  }
}

// The conversions promise round-to-nearest-even whatever the caller's
// dynamic rounding mode (the fp32 steps inside them are all exact).
TEST(NarrowFloat, NarrowingRoundsToNearestEvenInEveryRoundingMode) {
  std::mt19937_64 rng(20);
  std::vector<float> inputs;
  for (int i = 0; i < 20000; ++i) {
    inputs.push_back(fromBits<float>(randomWithExponent(kFloat32, 90, 160, rng)));
  }
  for (uint64_t code = 0; code < 0x7c00; code += 7) {  // fp16 ties, subnormal ones included
    inputs.push_back(static_cast<float>((decode(kFloat16, code) + decode(kFloat16, code + 1)) / 2));
  }
  for (const Converter& c : kConverters) {
    std::vector<uint64_t> expected;
    for (float x : inputs) expected.push_back(c.narrow(x));
    for (int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
      std::vector<uint64_t> got;
      ASSERT_EQ(std::fesetround(mode), 0);
      for (float x : inputs) got.push_back(c.narrow(x));
      std::fesetround(FE_TONEAREST);
      Mismatches bad(std::string(c.format->name()) + " in rounding mode " + std::to_string(mode));
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (got[i] != expected[i]) {
          bad.add(std::to_string(inputs[i]) + " gave " + hex(got[i]) + ", want " +
                  hex(expected[i]));
        }
      }
    }
  }
}

TEST(NarrowFloat, FloatToHalfRoundsTiesToEven) {
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);             // tie: down to 1
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie: up to 1 + 2^-9
  EXPECT_EQ(floatToHalf(2049.0f), 0x6800);                     // 2048
  EXPECT_EQ(floatToHalf(2051.0f), 0x6802);                     // 2052
  EXPECT_EQ(floatToHalf(-2051.0f), 0xe802);                    // -2052
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
}

TEST(NarrowFloat, FloatToHalfOverflowsToInfinity) {
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // tie between 65504 and 2^16: even is inf
  EXPECT_EQ(floatToHalf(1e9f), 0x7c00);
  EXPECT_EQ(floatToHalf(-1e9f), 0xfc00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(NarrowFloat, FloatToHalfRoundsSubnormals) {
  EXPECT_EQ(floatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);  // tie with zero: even is zero
  EXPECT_EQ(floatToHalf(-0x1p-25f), 0x8000);
  EXPECT_EQ(floatToHalf(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(floatToHalf(3 * 0x1p-25f), 0x0002);        // tie between 1 and 2 units: 2
  EXPECT_EQ(floatToHalf(5 * 0x1p-25f), 0x0002);        // tie between 2 and 3 units: 2
  EXPECT_EQ(floatToHalf(1023.5f * 0x1p-24f), 0x0400);  // largest subnormal + half: min normal
  EXPECT_EQ(floatToHalf(1023.25f * 0x1p-24f), 0x03ff);
  EXPECT_EQ(floatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(halfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(halfToFloat(0x03ff), 1023 * 0x1p-24f);
}

TEST(NarrowFloat, NaNNarrowsToQuietNaNKeepingSign) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  const float signaling = fromBits<float>(0x7f800001);  // payload only in low bits
  const float negSignaling = fromBits<float>(0xff800001);
  EXPECT_EQ(floatToHalf(quiet) & 0x7e00, 0x7e00);
  EXPECT_EQ(floatToHalf(signaling), 0x7e00);
  EXPECT_EQ(floatToHalf(negSignaling), 0xfe00);
  EXPECT_EQ(floatToBf16(signaling), 0x7fc0);
  EXPECT_EQ(floatToBf16(negSignaling), 0xffc0);
  EXPECT_EQ(floatToFp8e4m3(signaling), 0x7f);
  EXPECT_EQ(floatToFp8e4m3(negSignaling), 0xff);
  EXPECT_EQ(floatToFp8e5m2(signaling), 0x7e);
  EXPECT_EQ(floatToFp8e5m2(negSignaling), 0xfe);
  EXPECT_TRUE(std::isnan(halfToFloat(0x7c01)));  // signaling fp16 NaN widens to NaN
  EXPECT_TRUE(std::isnan(fp8e4m3ToFloat(0xff)));
  EXPECT_TRUE(std::isnan(fp8e5m2ToFloat(0x7d)));
}

TEST(NarrowFloat, FloatToBf16RoundsTiesToEvenAndOverflowsToInfinity) {
  EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f), 0x3f80);      // tie: down to 1
  EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie: up to even
  EXPECT_EQ(floatToBf16(fromBits<float>(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past max: inf
  EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  // Subnormals: the float 0x00008000 is half of bf16's smallest subnormal.
  EXPECT_EQ(floatToBf16(fromBits<float>(0x00008000)), 0x0000);
  EXPECT_EQ(floatToBf16(fromBits<float>(0x00008001)), 0x0001);
  EXPECT_EQ(floatToBf16(fromBits<float>(0x00018000)), 0x0002);
  EXPECT_EQ(floatToBf16(fromBits<float>(0x007fffff)), 0x0080);  // up into the smallest normal
}

TEST(NarrowFloat, FloatToFp8e4m3SaturatesAndHasNoInfinity) {
  EXPECT_EQ(floatToFp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(464.0f), 0x7e);  // tie between 448 and 480
  EXPECT_EQ(floatToFp8e4m3(480.0f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(1e9f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(-1e9f), 0xfe);
  EXPECT_EQ(floatToFp8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(fp8e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3ToFloat(0x78), 256.0f);  // exponent all ones is still finite
  EXPECT_EQ(fp8e4m3ToFloat(0x01), 0x1p-9f);
}

TEST(NarrowFloat, FloatToFp8e4m3RoundsTiesToEvenAndSubnormals) {
  EXPECT_EQ(floatToFp8e4m3(1.0625f), 0x38);  // tie between 1 and 1.125: 1
  EXPECT_EQ(floatToFp8e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: 1.25
  EXPECT_EQ(floatToFp8e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(floatToFp8e4m3(0x1p-10f), 0x00);  // tie with zero
  EXPECT_EQ(floatToFp8e4m3(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(floatToFp8e4m3(-3 * 0x1p-10f), 0x82);
}

TEST(NarrowFloat, FloatToFp8e5m2SaturatesFiniteButKeepsInfinity) {
  EXPECT_EQ(floatToFp8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(61440.0f), 0x7b);  // tie that IEEE would send to inf
  EXPECT_EQ(floatToFp8e5m2(1e9f), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(-1e9f), 0xfb);
  EXPECT_EQ(floatToFp8e5m2(std::numeric_limits<float>::infinity()), 0x7c);
  EXPECT_EQ(floatToFp8e5m2(-std::numeric_limits<float>::infinity()), 0xfc);
  EXPECT_EQ(floatToFp8e5m2(1.125f), 0x3c);  // tie between 1 and 1.25: 1
  EXPECT_EQ(floatToFp8e5m2(1.375f), 0x3e);  // tie between 1.25 and 1.5: 1.5
  EXPECT_EQ(floatToFp8e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(floatToFp8e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(floatToFp8e5m2(3 * 0x1p-17f), 0x02);
}

}  // namespace
}  // namespace braid::reduce

// ---- streaming stores (reduce/streaming.h) ----

// Every length around the 16-byte store and the 64-byte loop, at every
// misalignment of source and destination: the bytes written are exactly
// the source's, and nothing around them changes.
TEST(StreamingStores, CopyWritesExactlyTheBytesAtEveryAlignmentAndLength) {
  std::vector<std::byte> src(512), dst(640);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  for (size_t srcShift = 0; srcShift < 16; ++srcShift)
    for (size_t dstShift = 0; dstShift < 16; ++dstShift)
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{63},
                           size_t{64}, size_t{65}, size_t{127}, size_t{200}, size_t{480}}) {
        std::fill(dst.begin(), dst.end(), std::byte{0xee});
        braid::reduce::copyStreaming(dst.data() + 64 + dstShift, src.data() + srcShift, bytes);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 64 + dstShift && i < 64 + dstShift + bytes;
          const std::byte want = inside ? src[srcShift + i - 64 - dstShift] : std::byte{0xee};
          ASSERT_EQ(dst[i], want) << "byte " << i << " of a " << bytes << "-byte copy, source +"
                                  << srcShift << ", destination +" << dstShift;
        }
      }
}

// Over several of its 4 KiB blocks and a tail, for each element size: the
// same result as the kernel writing the output itself.
TEST(StreamingStores, ReduceMatchesTheKernelForEveryElementSize) {
  using braid::DataType;
  for (DataType type : {DataType::Int8, DataType::Float16, DataType::Float32, DataType::Float64}) {
    const size_t elem = braid::dataTypeSize(type);
    const size_t count = 3 * 4096 / elem + 37;
    std::vector<std::byte> a(count * elem + 8), b(count * elem), want(count * elem),
        got(count * elem + 16);
    std::mt19937 random(static_cast<unsigned>(elem));
    // Small integers' bit patterns: finite in every type.
    for (auto* v : {&a, &b})
      for (size_t i = 0; i < v->size(); ++i) (*v)[i] = static_cast<std::byte>(random() % 60);
    braid::reduce::Kernel kernel = braid::reduce::kernelFor(type, braid::ReduceOp::Max);
    kernel(want.data(), a.data() + 8, b.data(), count);
    braid::reduce::reduceStreaming(kernel, got.data() + 16, a.data() + 8, b.data(), count, elem);
    EXPECT_EQ(std::memcmp(got.data() + 16, want.data(), want.size()), 0)
        << braid::dataTypeName(type);
    // With a second copy, streamed or written by the kernel itself.
    for (auto how : {braid::reduce::Also::Streamed, braid::reduce::Also::Cached}) {
      std::vector<std::byte> out(count * elem), also(count * elem);
      braid::reduce::reduceStreaming(kernel, out.data(), a.data() + 8, b.data(), count, elem,
                                     also.data(), how);
      EXPECT_EQ(out, want) << braid::dataTypeName(type);
      EXPECT_EQ(also, want) << braid::dataTypeName(type);
    }
    // Written with ordinary stores and copied block by block, apart and in
    // place (the output is b), touching nothing past the copy.
    std::vector<std::byte> out(count * elem), also(count * elem + 1, std::byte{0xee});
    braid::reduce::reduceCopying(kernel, out.data(), a.data() + 8, b.data(), count, type,
                                 braid::ReduceOp::Max, 1, also.data());
    EXPECT_EQ(out, want) << braid::dataTypeName(type);
    EXPECT_EQ(std::memcmp(also.data(), want.data(), want.size()), 0) << braid::dataTypeName(type);
    EXPECT_EQ(also.back(), std::byte{0xee}) << braid::dataTypeName(type);
    std::vector<std::byte> inPlace(b), copied(count * elem);
    braid::reduce::reduceCopying(kernel, inPlace.data(), a.data() + 8, inPlace.data(), count, type,
                                 braid::ReduceOp::Max, 1, copied.data());
    EXPECT_EQ(inPlace, want) << braid::dataTypeName(type);
    EXPECT_EQ(copied, want) << braid::dataTypeName(type);
    // An average is divided before it is copied.
    braid::reduce::Kernel averaging = braid::reduce::kernelFor(type, braid::ReduceOp::Avg);
    std::vector<std::byte> mean(count * elem), meanOut(count * elem), meanAlso(count * elem);
    averaging(mean.data(), a.data() + 8, b.data(), count);
    braid::reduce::finalize(mean.data(), count, type, braid::ReduceOp::Avg, 2);
    braid::reduce::reduceCopying(averaging, meanOut.data(), a.data() + 8, b.data(), count, type,
                                 braid::ReduceOp::Avg, 2, meanAlso.data());
    EXPECT_EQ(meanOut, mean) << braid::dataTypeName(type);
    EXPECT_EQ(meanAlso, mean) << braid::dataTypeName(type);
  }
}

// copy() takes its own loop where the destination lies 1 to 63 bytes past
// the source modulo a page: every such distance, and memcpy's on either
// side, copy exactly the bytes, at lengths around the loop's 64-byte turn.
TEST(Copies, CopyWritesExactlyTheBytesAtEveryDistanceFromTheSource) {
  constexpr size_t kPage = 4096, kGuard = 64;
  std::vector<std::byte> src(5000), dst(kPage + src.size() + 2 * kGuard);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13 + 5);
  const uintptr_t from = reinterpret_cast<uintptr_t>(src.data());
  for (size_t distance = 0; distance <= 65; ++distance)
    for (size_t bytes :
         {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, src.size()}) {
      // The first place past the guard that lies `distance` past src, mod a page.
      const uintptr_t low = reinterpret_cast<uintptr_t>(dst.data()) + kGuard;
      const size_t shift = (from + distance - low) % kPage;
      std::byte* to = dst.data() + kGuard + shift;
      std::fill(dst.begin(), dst.end(), std::byte{0xee});
      braid::reduce::copy(to, src.data(), bytes);
      for (size_t i = 0; i < dst.size(); ++i) {
        const size_t at = static_cast<size_t>(&dst[i] - to);
        const bool inside = &dst[i] >= to && at < bytes;
        ASSERT_EQ(dst[i], inside ? src[at] : std::byte{0xee})
            << "byte " << i << " of a " << bytes << "-byte copy " << distance
            << " bytes past its source";
      }
    }
}
