#include "benchmarks/perf_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace braid::perf {

namespace {

// A small binary floating-point format: sign, expBits, mantBits.
struct Minifloat {
  int expBits;
  int mantBits;
  int bias;
  // IEEE-style: the top exponent holds inf and NaN. Otherwise (fp8e4m3, the
  // OCP "FN" variant NCCL and CUDA use) only all-ones is NaN and there is no inf.
  bool ieeeSpecials;
};

constexpr Minifloat kHalf{5, 10, 15, true};
constexpr Minifloat kBFloat16{8, 7, 127, true};
constexpr Minifloat kE4M3{4, 3, 7, false};
constexpr Minifloat kE5M2{5, 2, 15, true};

// Encodes a value the format represents exactly as a normal number (or zero).
uint32_t encodeMinifloat(double value, const Minifloat& f) {
  uint32_t sign = std::signbit(value) ? 1u : 0u;
  double magnitude = std::fabs(value);
  uint32_t bits = 0;
  if (magnitude != 0) {
    int e = 0;
    double m = std::frexp(magnitude, &e);  // magnitude = m * 2^e, m in [0.5, 1)
    int exponent = e - 1 + f.bias;
    double mantissa = std::ldexp(m * 2 - 1, f.mantBits);
    int topExponent = (1 << f.expBits) - 1;
    bool reserved = f.ieeeSpecials ? exponent >= topExponent
                                   : exponent > topExponent ||
                                         (exponent == topExponent &&
                                          mantissa == static_cast<double>((1 << f.mantBits) - 1));
    if (exponent < 1 || reserved || mantissa != std::floor(mantissa))
      throw std::logic_error("braid-perf: " + std::to_string(value) +
                             " is not exact in the check's data type");
    bits = (static_cast<uint32_t>(exponent) << f.mantBits) | static_cast<uint32_t>(mantissa);
  }
  return (sign << (f.expBits + f.mantBits)) | bits;
}

double decodeMinifloat(uint32_t bits, const Minifloat& f) {
  uint32_t mantMask = (1u << f.mantBits) - 1;
  uint32_t topExponent = (1u << f.expBits) - 1;
  bool negative = (bits >> (f.expBits + f.mantBits)) & 1u;
  uint32_t exponent = (bits >> f.mantBits) & topExponent;
  uint32_t mantissa = bits & mantMask;
  double magnitude;
  if (f.ieeeSpecials && exponent == topExponent) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (!f.ieeeSpecials && exponent == topExponent && mantissa == mantMask) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, 1 - f.bias - f.mantBits);
  } else {
    magnitude =
        std::ldexp(mantissa | (1u << f.mantBits), static_cast<int>(exponent) - f.bias - f.mantBits);
  }
  return negative ? -magnitude : magnitude;
}

template <typename T>
void store(void* buffer, size_t index, T value) {
  std::memcpy(static_cast<char*>(buffer) + index * sizeof(T), &value, sizeof(T));
}

template <typename T>
T load(const void* buffer, size_t index) {
  T value;
  std::memcpy(&value, static_cast<const char*>(buffer) + index * sizeof(T), sizeof(T));
  return value;
}

// A well-mixed 64-bit hash of (rank, index) (the splitmix64 finalizer), so
// neighbouring elements and ranks get unrelated values.
uint64_t hash(int rank, size_t index) {
  uint64_t x = static_cast<uint64_t>(index) * 0x100000001b3ull + static_cast<uint64_t>(rank) +
               0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr double kMaxInput = 63;  // the largest magnitude of an input
constexpr int kMaxTwos = 12;      // the largest power of two a prod reaches

struct TypeLimits {
  double sumLimit;  // the largest sum an element may reach
  int maxTwos;      // the largest power of two a product may reach
};

TypeLimits limitsOf(DataType type) {
  switch (type) {
    case DataType::Int8:
      return {127, 6};
    case DataType::Uint8:
      return {254, 7};  // 255 is the poison
    case DataType::Float16:
      return {2048, 15};
    case DataType::BFloat16:
      return {256, 127};
    case DataType::Float8E4M3:
      return {16, 7};  // 2^8 would need the top exponent
    case DataType::Float8E5M2:
      return {8, 15};
    case DataType::Float32:
      return {16777216.0, 127};
    default:
      return {2147483647.0, 30};  // float64 and the 32- and 64-bit integers
  }
}

}  // namespace

void storeValue(DataType type, void* buffer, size_t index, double value) {
  switch (type) {
    case DataType::Int8:
      store(buffer, index, static_cast<int8_t>(value));
      break;
    case DataType::Uint8:
      store(buffer, index, static_cast<uint8_t>(value));
      break;
    case DataType::Int32:
      store(buffer, index, static_cast<int32_t>(value));
      break;
    case DataType::Uint32:
      store(buffer, index, static_cast<uint32_t>(value));
      break;
    case DataType::Int64:
      store(buffer, index, static_cast<int64_t>(value));
      break;
    case DataType::Uint64:
      store(buffer, index, static_cast<uint64_t>(value));
      break;
    case DataType::Float32:
      store(buffer, index, static_cast<float>(value));
      break;
    case DataType::Float64:
      store(buffer, index, value);
      break;
    case DataType::Float16:
      store(buffer, index, static_cast<uint16_t>(encodeMinifloat(value, kHalf)));
      break;
    case DataType::BFloat16:
      store(buffer, index, static_cast<uint16_t>(encodeMinifloat(value, kBFloat16)));
      break;
    case DataType::Float8E4M3:
      store(buffer, index, static_cast<uint8_t>(encodeMinifloat(value, kE4M3)));
      break;
    case DataType::Float8E5M2:
      store(buffer, index, static_cast<uint8_t>(encodeMinifloat(value, kE5M2)));
      break;
  }
}

double loadValue(DataType type, const void* buffer, size_t index) {
  switch (type) {
    case DataType::Int8:
      return load<int8_t>(buffer, index);
    case DataType::Uint8:
      return load<uint8_t>(buffer, index);
    case DataType::Int32:
      return load<int32_t>(buffer, index);
    case DataType::Uint32:
      return load<uint32_t>(buffer, index);
    case DataType::Int64:
      return static_cast<double>(load<int64_t>(buffer, index));
    case DataType::Uint64:
      return static_cast<double>(load<uint64_t>(buffer, index));
    case DataType::Float32:
      return load<float>(buffer, index);
    case DataType::Float64:
      return load<double>(buffer, index);
    case DataType::Float16:
      return decodeMinifloat(load<uint16_t>(buffer, index), kHalf);
    case DataType::BFloat16:
      return decodeMinifloat(load<uint16_t>(buffer, index), kBFloat16);
    case DataType::Float8E4M3:
      return decodeMinifloat(load<uint8_t>(buffer, index), kE4M3);
    case DataType::Float8E5M2:
      return decodeMinifloat(load<uint8_t>(buffer, index), kE5M2);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

Pattern::Pattern(DataType type, ReduceOp op, bool reduces, int nranks)
    : type_(type), op_(op), reduces_(reduces), nranks_(nranks) {
  TypeLimits limits = limitsOf(type);
  sumLimit_ = limits.sumLimit;
  maxTwos_ = std::min(limits.maxTwos, kMaxTwos);
  signed_ = type != DataType::Uint8 && type != DataType::Uint32 && type != DataType::Uint64;
}

double Pattern::budgeted(int rank, size_t index, double budget) const {
  uint64_t h = hash(rank, index);
  if (budget >= nranks_) {
    double k = std::min(kMaxInput, std::floor(budget / nranks_));
    return static_cast<double>(h % static_cast<uint64_t>(k + 1));
  }
  // Fewer units than ranks: only `budget` ranks, a different set for each
  // element, may contribute a 1.
  size_t slot = (index % static_cast<size_t>(nranks_) + static_cast<size_t>(rank)) %
                static_cast<size_t>(nranks_);
  return static_cast<double>(slot) < budget && (h & 1) ? 1 : 0;
}

double Pattern::input(int rank, size_t index) const {
  if (reduces_ && op_ == ReduceOp::Sum) return budgeted(rank, index, sumLimit_);
  if (reduces_ && op_ == ReduceOp::Avg)
    return nranks_ * budgeted(rank, index, std::floor(sumLimit_ / nranks_));
  if (reduces_ && op_ == ReduceOp::Prod) {
    // At most maxTwos_ ranks per element contribute a 2, the rest a 1.
    size_t slot = (index % static_cast<size_t>(nranks_) + static_cast<size_t>(rank)) %
                  static_cast<size_t>(nranks_);
    return slot < static_cast<size_t>(maxTwos_) && (hash(rank, index) & 1) ? 2 : 1;
  }
  // Max, min and the collectives that only move data: any exact value,
  // negative ones too where the type has them.
  double k = std::min(kMaxInput, sumLimit_);
  double value = static_cast<double>(hash(rank, index) % static_cast<uint64_t>(k + 1));
  return signed_ ? value - std::floor(k / 2) : value;
}

double Pattern::reduced(size_t index) const {
  double result = input(0, index);
  for (int r = 1; r < nranks_; ++r) {
    double v = input(r, index);
    switch (op_) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        result += v;
        break;
      case ReduceOp::Prod:
        result *= v;
        break;
      case ReduceOp::Max:
        result = std::max(result, v);
        break;
      case ReduceOp::Min:
        result = std::min(result, v);
        break;
    }
  }
  // Exact: every avg input is a multiple of nranks_.
  return op_ == ReduceOp::Avg ? result / nranks_ : result;
}

void prepareCheck(const CheckCase& c) {
  Pattern pattern(c.type, c.op, reduces(c.collective), c.nranks);
  size_t elementBytes = dataTypeSize(c.type);
  auto fill = [&](void* buffer, size_t elements, int rank) {
    for (size_t i = 0; i < elements; ++i) storeValue(c.type, buffer, i, pattern.input(rank, i));
  };
  // A value no correct result has: NaN, the most negative signed integer
  // (0x80...) or the largest unsigned one (0xff...).
  bool signedInteger =
      c.type == DataType::Int8 || c.type == DataType::Int32 || c.type == DataType::Int64;
  auto poison = [&](void* buffer, size_t elements) {
    std::memset(buffer, signedInteger ? 0x80 : 0xff, elements * elementBytes);
  };
  size_t all = c.count * static_cast<size_t>(c.nranks);
  switch (c.collective) {
    case Collective::AllReduce:
    case Collective::Reduce:
      fill(c.send, c.count, c.rank);
      if (!c.inPlace) poison(c.recv, c.count);
      break;
    case Collective::Broadcast:
      if (c.inPlace && c.rank != c.root) {
        poison(c.recv, c.count);
      } else {
        fill(c.send, c.count, c.rank);
        if (!c.inPlace) poison(c.recv, c.count);
      }
      break;
    case Collective::AllGather:
      poison(c.recv, all);            // in place, send lies inside recv:
      fill(c.send, c.count, c.rank);  // fill it after poisoning
      break;
    case Collective::ReduceScatter:
      fill(c.send, all, c.rank);  // in place, recv lies inside send
      if (!c.inPlace) poison(c.recv, c.count);
      break;
    case Collective::SendRecv:
    case Collective::PutSignal:
      if (c.inPlace) {
        // The same buffer is sent and received into at once: only data that
        // every rank holds alike makes that well defined (as in nccl-tests).
        fill(c.recv, c.count, 0);
      } else {
        fill(c.send, c.count, c.rank);
        poison(c.recv, c.count);
      }
      break;
  }
}

uint64_t countWrong(const CheckCase& c) {
  Pattern pattern(c.type, c.op, reduces(c.collective), c.nranks);
  uint64_t wrong = 0;
  auto check = [&](size_t elements, auto expected) {
    for (size_t i = 0; i < elements; ++i)
      if (!(loadValue(c.type, c.recv, i) == expected(i))) ++wrong;  // NaN is wrong
  };
  size_t count = c.count;
  switch (c.collective) {
    case Collective::AllReduce:
      check(count, [&](size_t i) { return pattern.reduced(i); });
      break;
    case Collective::Reduce:
      if (c.rank == c.root) check(count, [&](size_t i) { return pattern.reduced(i); });
      break;
    case Collective::Broadcast:
      check(count, [&](size_t i) { return pattern.input(c.root, i); });
      break;
    case Collective::AllGather:
      check(count * static_cast<size_t>(c.nranks),
            [&](size_t i) { return pattern.input(static_cast<int>(i / count), i % count); });
      break;
    case Collective::ReduceScatter:
      check(count, [&](size_t i) { return pattern.reduced(c.rank * count + i); });
      break;
    case Collective::SendRecv:
    case Collective::PutSignal: {
      int from = c.inPlace ? 0 : (c.rank - 1 + c.nranks) % c.nranks;
      check(count, [&](size_t i) { return pattern.input(from, i); });
      break;
    }
  }
  return wrong;
}

}  // namespace braid::perf
