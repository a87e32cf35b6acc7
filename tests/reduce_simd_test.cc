// Every ISA level's reduction kernels (src/reduce/dispatch.h) give the same
// bits as the scalar kernels, for every DataType x ReduceOp: on edge values
// (zeros of both signs, subnormals, the largest finite values, infinities,
// quiet and signaling NaNs, integer limits) and random ones, at every count
// from 0 to 300, at element offsets that misalign the buffers against every
// vector width, and in place. reduce_test.cc checks the scalar kernels
// against an independent reference; here the scalar kernels are the
// reference. A level this CPU does not support is skipped, by name.
//
// "The same bits" includes which NaN Max and Min return: every level makes
// elementwise.h's choice with selects. For Sum, Prod and Avg a NaN result may
// differ in payload: when both operands are NaN the hardware returns the
// first source operand, and the compiler may commute a + b in either path.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "reduce/dispatch.h"
#include "reduce/reduce.h"

namespace braid::reduce {
namespace {

constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                                ReduceOp::Avg};

constexpr DataType kAllTypes[] = {
    DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
    DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
    DataType::Float64, DataType::BFloat16, DataType::Float8E4M3, DataType::Float8E5M2,
};

constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};
constexpr const char* kTypeNames[] = {"int8",    "uint8",    "int32",      "uint32",
                                      "int64",   "uint64",   "float16",    "float32",
                                      "float64", "bfloat16", "float8e4m3", "float8e5m2"};
constexpr size_t kTypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

std::string nameOf(DataType type, ReduceOp op) {
  return std::string(kTypeNames[static_cast<int>(type)]) + " " + kOpNames[static_cast<int>(op)];
}
size_t sizeOf(DataType type) { return kTypeSizes[static_cast<int>(type)]; }

// Field widths of the floating-point types; expBits == 0 for integers.
struct Layout {
  int expBits;
  int fracBits;
  bool ieeeSpecials;  // exponent all ones is inf/NaN; else (E4M3) only S.1111.111 is NaN
};

Layout layoutOf(DataType type) {
  switch (type) {
    case DataType::Float16:
      return {5, 10, true};
    case DataType::Float32:
      return {8, 23, true};
    case DataType::Float64:
      return {11, 52, true};
    case DataType::BFloat16:
      return {8, 7, true};
    case DataType::Float8E4M3:
      return {4, 3, false};
    case DataType::Float8E5M2:
      return {5, 2, true};
    default:
      return {0, 0, false};
  }
}

uint64_t widthMask(DataType type) {
  const size_t bits = 8 * sizeOf(type);
  return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// Bit patterns that sit on the edges of the type's behaviour, both signs.
std::vector<uint64_t> edgePatterns(DataType type) {
  const Layout l = layoutOf(type);
  const uint64_t mask = widthMask(type);
  const uint64_t signBit = mask ^ (mask >> 1);
  std::vector<uint64_t> magnitudes;
  if (l.expBits == 0) {
    magnitudes = {0,
                  1,
                  2,
                  3,
                  7,
                  0x7f,
                  0x80,
                  0xff,
                  signBit - 1,
                  signBit - 2,
                  signBit >> 1,
                  0x5555555555555555ull & (signBit - 1)};
  } else {
    const uint64_t frac = (uint64_t{1} << l.fracBits) - 1;
    const uint64_t expOnes = ((uint64_t{1} << l.expBits) - 1) << l.fracBits;
    const uint64_t one = ((uint64_t{1} << (l.expBits - 1)) - 1) << l.fracBits;
    const uint64_t maxFinite = l.ieeeSpecials ? expOnes - 1 : (signBit - 1) - 1;
    magnitudes = {
        0,                     // zero
        1,                     // smallest subnormal
        2,                     //
        frac,                  // largest subnormal
        frac + 1,              // smallest normal
        frac + 2,              //
        one - 1,               // just below 1
        one,                   // 1
        one + 1,               // just above 1
        one + (frac + 1) / 2,  // 1.5
        one + frac + 1,        // 2
        maxFinite - 1,         //
        maxFinite,             // largest finite
    };
    if (l.ieeeSpecials) {
      magnitudes.push_back(expOnes);                                      // inf
      magnitudes.push_back(expOnes | (uint64_t{1} << (l.fracBits - 1)));  // quiet NaN
      magnitudes.push_back(expOnes | 1);                                  // signaling NaN
      magnitudes.push_back(expOnes | frac);                               // NaN, full payload
    } else {
      magnitudes.push_back(signBit - 1);  // E4M3's only NaN
    }
  }
  std::vector<uint64_t> out;
  for (uint64_t m : magnitudes) {
    out.push_back(m & mask & ~signBit);
    out.push_back((m | signBit) & mask);
  }
  return out;
}

// Element storage: bit patterns, written and read at the element size.
class Elements {
 public:
  Elements(DataType type, size_t count) : size_(sizeOf(type)), bytes_(count * size_) {}
  size_t count() const { return bytes_.size() / size_; }
  void set(size_t i, uint64_t bits) { std::memcpy(&bytes_[i * size_], &bits, size_); }
  uint64_t get(size_t i) const {
    uint64_t bits = 0;
    std::memcpy(&bits, &bytes_[i * size_], size_);
    return bits;
  }
  void push(uint64_t bits) {
    bytes_.resize(bytes_.size() + size_);
    set(count() - 1, bits);
  }
  unsigned char* data() { return bytes_.data(); }
  const unsigned char* data() const { return bytes_.data(); }

 private:
  size_t size_;
  // uint64_t-aligned by the allocator, so every element is aligned.
  std::vector<unsigned char> bytes_;
};

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Random bits; for float types, half the time a value of moderate size
// (exponent within 8 of the bias, random sign and fraction), so that sums
// and products are more than overflow, underflow and NaN.
uint64_t randomPattern(DataType type, std::mt19937_64& rng) {
  const Layout l = layoutOf(type);
  const uint64_t bits = rng() & widthMask(type);
  if (l.expBits == 0 || rng() % 2 == 0) return bits;
  const uint64_t bias = (uint64_t{1} << (l.expBits - 1)) - 1;
  const uint64_t spread = bias < 8 ? bias - 1 : 8;
  const uint64_t exponent = bias - spread + rng() % (2 * spread + 1);
  const uint64_t signAndFrac = bits & ~(((uint64_t{1} << l.expBits) - 1) << l.fracBits);
  return signAndFrac | exponent << l.fracBits;
}

bool isNan(DataType type, uint64_t bits) {
  const Layout l = layoutOf(type);
  if (l.expBits == 0) return false;
  const uint64_t magnitude = bits & (widthMask(type) >> 1);
  const uint64_t expOnes = ((uint64_t{1} << l.expBits) - 1) << l.fracBits;
  return l.ieeeSpecials ? magnitude > expOnes : magnitude == (widthMask(type) >> 1);
}

// The same bits, or (for the arithmetic ops only) NaN both.
bool sameResult(DataType type, ReduceOp op, uint64_t x, uint64_t y) {
  if (x == y) return true;
  const bool arithmetic = op == ReduceOp::Sum || op == ReduceOp::Prod || op == ReduceOp::Avg;
  return arithmetic && isNan(type, x) && isNan(type, y);
}

struct Operands {
  Elements a;
  Elements b;
};

// Edge x edge pairs; equal pairs; for 1-byte types every pair; for 2-byte
// floats every pattern against edge and random partners, in both operand
// positions; for the wider types random pairs and near neighbours.
Operands operandsFor(DataType type, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Operands ops{Elements(type, 0), Elements(type, 0)};
  auto add = [&](uint64_t x, uint64_t y) {
    ops.a.push(x);
    ops.b.push(y);
  };
  const std::vector<uint64_t> edges = edgePatterns(type);
  for (uint64_t x : edges) {
    for (uint64_t y : edges) add(x, y);
  }
  if (sizeOf(type) == 1) {
    for (uint64_t x = 0; x < 256; ++x) {
      for (uint64_t y = 0; y < 256; ++y) add(x, y);
    }
  } else if (sizeOf(type) == 2) {
    std::vector<uint64_t> partners = edges;
    for (int i = 0; i < 24; ++i) partners.push_back(randomPattern(type, rng));
    for (uint64_t partner : partners) {
      for (uint64_t x = 0; x < 65536; ++x) {
        add(x, partner);
        add(partner, x);
      }
    }
  } else {
    const uint64_t signBit = widthMask(type) ^ (widthMask(type) >> 1);
    for (int i = 0; i < 100000; ++i) {
      const uint64_t x = randomPattern(type, rng);
      add(x, randomPattern(type, rng));
      add(x, x);
      // A near neighbour of either sign: ties when rounding, cancellation.
      const uint64_t neighbour = (x + rng() % 64) ^ (rng() % 2 == 0 ? 0 : signBit);
      add(x, neighbour & widthMask(type));
    }
  }
  return ops;
}

class ReduceIsa : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isaSupported(GetParam())) {
      GTEST_SKIP() << isaName(GetParam()) << " is not supported by this CPU";
    }
  }
};

TEST_P(ReduceIsa, MatchesScalarBitForBitOnEdgeAndRandomOperands) {
  uint64_t seed = 100;
  for (DataType type : kAllTypes) {
    const Operands ops = operandsFor(type, ++seed);
    const size_t count = ops.a.count();
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(nameOf(type, op));
      Elements want(type, count);
      Elements got(type, count);
      kernelFor(type, op, Isa::Scalar)(want.data(), ops.a.data(), ops.b.data(), count);
      kernelFor(type, op, GetParam())(got.data(), ops.a.data(), ops.b.data(), count);
      int bad = 0;
      for (size_t i = 0; i < count; ++i) {
        if (!sameResult(type, op, got.get(i), want.get(i)) && ++bad <= 8) {
          ADD_FAILURE() << hex(ops.a.get(i)) << " op " << hex(ops.b.get(i)) << " gave "
                        << hex(got.get(i)) << ", scalar gives " << hex(want.get(i));
        }
      }
      EXPECT_EQ(bad, 0) << "mismatches of " << count;
    }
  }
}

// Buffers with guard bytes around them, placed `offset` elements past a
// 64-byte boundary.
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kFill = 0xa5;

  Guarded(DataType type, size_t count, size_t offset)
      : type_(type),
        size_(sizeOf(type)),
        count_(count),
        storage_((2 * kGuard + (count + offset) * size_) / 8 + 9) {
    auto base = reinterpret_cast<uintptr_t>(storage_.data());
    first_ = reinterpret_cast<unsigned char*>((base + kGuard + 63) / 64 * 64) + offset * size_;
    std::memset(storage_.data(), kFill, storage_.size() * 8);
  }
  unsigned char* data() { return first_; }
  void fill(const Elements& from, size_t start) {
    std::memcpy(first_, from.data() + start * size_, count_ * size_);
  }
  // sameResult() for every element.
  bool sameAs(const Guarded& other, ReduceOp op) const {
    for (size_t i = 0; i < count_; ++i) {
      uint64_t x = 0;
      uint64_t y = 0;
      std::memcpy(&x, first_ + i * size_, size_);
      std::memcpy(&y, other.first_ + i * size_, size_);
      if (!sameResult(type_, op, x, y)) return false;
    }
    return true;
  }
  // Every byte outside [data(), data() + count) still holds kFill.
  bool guardsIntact() const {
    const auto* begin = reinterpret_cast<const unsigned char*>(storage_.data());
    const unsigned char* end = begin + storage_.size() * 8;
    for (const unsigned char* p = begin; p < end; ++p) {
      if ((p < first_ || p >= first_ + count_ * size_) && *p != kFill) return false;
    }
    return true;
  }

 private:
  DataType type_;
  size_t size_;
  size_t count_;
  std::vector<uint64_t> storage_;
  unsigned char* first_;
};

// (dst, a, b) offsets in elements: aligned, all equally misaligned, and
// misaligned differently from each other.
struct Offsets {
  size_t dst, a, b;
};
constexpr Offsets kOffsets[] = {{0, 0, 0}, {1, 1, 1}, {1, 2, 3}, {3, 0, 5}, {7, 5, 1}, {0, 3, 9}};

TEST_P(ReduceIsa, MatchesScalarAtEveryCountFrom0To300AndMisalignedOffsets) {
  constexpr size_t kMaxCount = 300;
  std::mt19937_64 rng(200);
  for (DataType type : kAllTypes) {
    Elements a(type, kMaxCount);
    Elements b(type, kMaxCount);
    const std::vector<uint64_t> edges = edgePatterns(type);
    for (size_t i = 0; i < kMaxCount; ++i) {
      // Mostly random; every fifth element an edge value, so NaN, inf and
      // zeros of both signs land in vector bodies and tails alike.
      a.set(i, i % 5 == 0 ? edges[rng() % edges.size()] : randomPattern(type, rng));
      b.set(i, i % 5 == 3 ? edges[rng() % edges.size()] : randomPattern(type, rng));
    }
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(nameOf(type, op));
      const Kernel scalar = kernelFor(type, op, Isa::Scalar);
      const Kernel kernel = kernelFor(type, op, GetParam());
      for (const Offsets& off : kOffsets) {
        for (size_t count = 0; count <= kMaxCount; ++count) {
          // Operands start at a count-dependent place, so tails see new data.
          const size_t start = (count * 7) % (kMaxCount - count + 1);
          Guarded x(type, count, off.a);
          Guarded y(type, count, off.b);
          x.fill(a, start);
          y.fill(b, start);
          Guarded want(type, count, off.dst);
          Guarded got(type, count, off.dst);
          scalar(want.data(), x.data(), y.data(), count);
          kernel(got.data(), x.data(), y.data(), count);
          ASSERT_TRUE(got.sameAs(want, op))
              << "count " << count << ", offsets " << off.dst << "/" << off.a << "/" << off.b;
          ASSERT_TRUE(got.guardsIntact()) << "count " << count << " wrote outside dst";
        }
      }
    }
  }
}

TEST_P(ReduceIsa, MatchesScalarInPlaceIntoEitherOperandOrBoth) {
  constexpr size_t kMaxCount = 300;
  std::mt19937_64 rng(300);
  for (DataType type : kAllTypes) {
    Elements a(type, kMaxCount);
    Elements b(type, kMaxCount);
    for (size_t i = 0; i < kMaxCount; ++i) {
      a.set(i, randomPattern(type, rng));
      b.set(i, randomPattern(type, rng));
    }
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(nameOf(type, op));
      const Kernel scalar = kernelFor(type, op, Isa::Scalar);
      const Kernel kernel = kernelFor(type, op, GetParam());
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{31}, size_t{64}, size_t{65},
                           size_t{129}, size_t{255}, size_t{300}}) {
        for (size_t offset : {0, 1, 3}) {
          Guarded x(type, count, offset);
          Guarded y(type, count, offset);
          x.fill(a, 0);
          y.fill(b, 0);
          Guarded wantAB(type, count, 0);
          Guarded wantAA(type, count, 0);
          scalar(wantAB.data(), x.data(), y.data(), count);
          scalar(wantAA.data(), x.data(), x.data(), count);

          Guarded intoA(type, count, offset);
          intoA.fill(a, 0);
          kernel(intoA.data(), intoA.data(), y.data(), count);
          Guarded intoB(type, count, offset);
          intoB.fill(b, 0);
          kernel(intoB.data(), x.data(), intoB.data(), count);
          Guarded intoBoth(type, count, offset);
          intoBoth.fill(a, 0);
          kernel(intoBoth.data(), intoBoth.data(), intoBoth.data(), count);

          const std::string where =
              "count " + std::to_string(count) + ", offset " + std::to_string(offset);
          EXPECT_TRUE(intoA.sameAs(wantAB, op) && intoA.guardsIntact()) << "dst == a, " << where;
          EXPECT_TRUE(intoB.sameAs(wantAB, op) && intoB.guardsIntact()) << "dst == b, " << where;
          EXPECT_TRUE(intoBoth.sameAs(wantAA, op) && intoBoth.guardsIntact())
              << "dst == a == b, " << where;
        }
      }
    }
  }
}

TEST_P(ReduceIsa, ZeroCountTouchesNothing) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) kernelFor(type, op, GetParam())(nullptr, nullptr, nullptr, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Reduce, ReduceIsa, testing::Values(Isa::Avx2, Isa::Avx512),
                         [](const testing::TestParamInfo<Isa>& info) {
                           return std::string(isaName(info.param));
                         });

TEST(ReduceDispatch, KernelForUsesTheBestSupportedLevel) {
  const Isa best = bestIsa();
  EXPECT_TRUE(isaSupported(best)) << isaName(best);
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best)) {
      EXPECT_FALSE(isaSupported(isa)) << isaName(isa);
    }
  }
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      EXPECT_EQ(kernelFor(type, op), kernelFor(type, op, best)) << nameOf(type, op);
    }
  }
  std::cout << "[          ] best ISA level here: " << isaName(best) << "\n";
}

TEST(ReduceDispatch, ScalarIsAlwaysSupportedAndEveryLevelHasEveryKernel) {
  EXPECT_TRUE(isaSupported(Isa::Scalar));
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isaSupported(isa)) continue;
    for (DataType type : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        EXPECT_NE(kernelFor(type, op, isa), nullptr) << isaName(isa) << " " << nameOf(type, op);
      }
    }
  }
}

TEST(ReduceDispatch, OutOfRangeLevelTypeOrOpHasNoKernel) {
  EXPECT_FALSE(isaSupported(static_cast<Isa>(kNumIsas)));
  EXPECT_EQ(kernelFor(DataType::Float32, ReduceOp::Sum, static_cast<Isa>(kNumIsas)), nullptr);
  EXPECT_EQ(kernelFor(DataType::Float32, ReduceOp::Sum, static_cast<Isa>(-1)), nullptr);
  EXPECT_EQ(kernelFor(static_cast<DataType>(kNumDataTypes), ReduceOp::Sum, Isa::Scalar), nullptr);
  EXPECT_EQ(kernelFor(DataType::Float32, static_cast<ReduceOp>(kNumReduceOps), Isa::Scalar),
            nullptr);
  EXPECT_STREQ(isaName(static_cast<Isa>(kNumIsas)), "invalid");
}

}  // namespace
}  // namespace braid::reduce
