#include "reference.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "reduce/reduce.h"

namespace braid::testing {
namespace {

uint64_t hash(uint64_t seed, int rank, size_t index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xD1B54A32D192ED03ull +
               index * 0x94D049BB133111EBull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Decoded value of element i of a typed buffer.
double load(DataType type, const void* base, size_t i) {
  switch (type) {
    case DataType::Int8:
      return static_cast<const int8_t*>(base)[i];
    case DataType::Uint8:
      return static_cast<const uint8_t*>(base)[i];
    case DataType::Int32:
      return static_cast<const int32_t*>(base)[i];
    case DataType::Uint32:
      return static_cast<const uint32_t*>(base)[i];
    case DataType::Int64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DataType::Uint64:
      return static_cast<double>(static_cast<const uint64_t*>(base)[i]);
    case DataType::Float16:
      return reduce::halfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::Float32:
      return static_cast<const float*>(base)[i];
    case DataType::Float64:
      return static_cast<const double*>(base)[i];
    case DataType::BFloat16:
      return reduce::bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::Float8E4M3:
      return reduce::fp8e4m3ToFloat(static_cast<const uint8_t*>(base)[i]);
    case DataType::Float8E5M2:
      return reduce::fp8e5m2ToFloat(static_cast<const uint8_t*>(base)[i]);
  }
  return 0;
}

// Integers as their two's-complement bits, for exact modular references.
uint64_t loadBits(DataType type, const void* base, size_t i) {
  switch (type) {
    case DataType::Int8:
      return static_cast<uint64_t>(static_cast<const int8_t*>(base)[i]);
    case DataType::Uint8:
      return static_cast<const uint8_t*>(base)[i];
    case DataType::Int32:
      return static_cast<uint64_t>(static_cast<const int32_t*>(base)[i]);
    case DataType::Uint32:
      return static_cast<const uint32_t*>(base)[i];
    case DataType::Int64:
      return static_cast<uint64_t>(static_cast<const int64_t*>(base)[i]);
    default:
      return static_cast<const uint64_t*>(base)[i];
  }
}

void store(DataType type, void* base, size_t i, double v) {
  switch (type) {
    case DataType::Int8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      break;
    case DataType::Uint8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::Int32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DataType::Uint32:
      static_cast<uint32_t*>(base)[i] = static_cast<uint32_t>(v);
      break;
    case DataType::Int64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DataType::Uint64:
      static_cast<uint64_t*>(base)[i] = static_cast<uint64_t>(v);
      break;
    case DataType::Float16:
      static_cast<uint16_t*>(base)[i] = reduce::floatToHalf(static_cast<float>(v));
      break;
    case DataType::Float32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DataType::Float64:
      static_cast<double*>(base)[i] = v;
      break;
    case DataType::BFloat16:
      static_cast<uint16_t*>(base)[i] = reduce::floatToBf16(static_cast<float>(v));
      break;
    case DataType::Float8E4M3:
      static_cast<uint8_t*>(base)[i] = reduce::floatToFp8e4m3(static_cast<float>(v));
      break;
    case DataType::Float8E5M2:
      static_cast<uint8_t*>(base)[i] = reduce::floatToFp8e5m2(static_cast<float>(v));
      break;
  }
}

bool isSigned(DataType type) {
  return type == DataType::Int8 || type == DataType::Int32 || type == DataType::Int64;
}

int bits(DataType type) { return static_cast<int>(dataTypeSize(type)) * 8; }

uint64_t truncateBits(uint64_t v, DataType type) {
  return bits(type) == 64 ? v : v & ((uint64_t{1} << bits(type)) - 1);
}

// Sign-extends a truncated value of `type` to 64 bits.
int64_t asSigned(uint64_t v, DataType type) {
  int shift = 64 - bits(type);
  return static_cast<int64_t>(v << shift) >> shift;
}

double unitRoundoff(DataType type) {
  switch (type) {
    case DataType::Float16:
      return std::ldexp(1.0, -11);
    case DataType::Float32:
      return std::ldexp(1.0, -24);
    case DataType::Float64:
      return std::ldexp(1.0, -53);
    case DataType::BFloat16:
      return std::ldexp(1.0, -8);
    case DataType::Float8E4M3:
      return std::ldexp(1.0, -4);
    case DataType::Float8E5M2:
      return std::ldexp(1.0, -3);
    default:
      return 0;
  }
}

double smallestSubnormal(DataType type) {
  switch (type) {
    case DataType::Float16:
      return std::ldexp(1.0, -24);
    case DataType::Float32:
      return std::ldexp(1.0, -149);
    case DataType::Float64:
      return 0;
    case DataType::BFloat16:
      return std::ldexp(1.0, -133);
    case DataType::Float8E4M3:
      return std::ldexp(1.0, -9);
    case DataType::Float8E5M2:
      return std::ldexp(1.0, -16);
    default:
      return 0;
  }
}

std::string describe(DataType type, ReduceOp op, size_t index, double got, double want,
                     double tolerance) {
  std::ostringstream out;
  out.precision(17);
  out << dataTypeName(type) << " " << reduceOpName(op) << ": element " << index << " is " << got
      << ", expected " << want;
  if (tolerance > 0) out << " within " << tolerance;
  return out.str();
}

}  // namespace

double inputValue(DataType type, ReduceOp op, uint64_t seed, int rank, size_t index) {
  uint64_t h = hash(seed, rank, index);
  if (!isFloatingPoint(type)) {
    // Sum/Avg/Max/Min: small values, negative too for signed types. Prod:
    // anything; the reference wraps exactly as the kernels do.
    if (op == ReduceOp::Prod)
      return static_cast<double>(static_cast<int64_t>(h % 7) - (isSigned(type) ? 3 : 0));
    int64_t v = static_cast<int64_t>(h % 201) - (isSigned(type) ? 100 : 0);
    if (type == DataType::Int8 || type == DataType::Uint8) v /= 16;  // stays in range at 8 ranks
    return static_cast<double>(v);
  }
  double unit = static_cast<double>(h >> 11) / static_cast<double>(uint64_t{1} << 53);  // [0,1)
  double v;
  if (op == ReduceOp::Prod) {
    v = (0.5 + unit) * ((h & 1) ? -1 : 1);  // |v| in [0.5, 1.5): products stay in range
  } else {
    v = 2 * unit - 1;  // [-1, 1)
  }
  // Round through the type so the input is exactly what the buffer holds.
  unsigned char scratch[8];
  store(type, scratch, 0, v);
  return load(type, scratch, 0);
}

void fillInput(DataType type, ReduceOp op, uint64_t seed, int rank, size_t first, size_t count,
               void* buffer) {
  for (size_t i = 0; i < count; ++i)
    store(type, buffer, i, inputValue(type, op, seed, rank, first + i));
}

std::vector<std::byte> poisoned(DataType type, size_t count) {
  return std::vector<std::byte>(count * dataTypeSize(type), std::byte{0xA5});
}

std::string checkReduced(DataType type, ReduceOp op, uint64_t seed, int nranks, size_t first,
                         size_t count, const void* got) {
  for (size_t i = 0; i < count; ++i) {
    const size_t index = first + i;
    if (!isFloatingPoint(type)) {
      uint64_t acc = 0;
      for (int r = 0; r < nranks; ++r) {
        unsigned char scratch[8];
        store(type, scratch, 0, inputValue(type, op, seed, r, index));
        uint64_t x = loadBits(type, scratch, 0);
        if (r == 0) {
          acc = x;
          continue;
        }
        switch (op) {
          case ReduceOp::Sum:
          case ReduceOp::Avg:
            acc += x;
            break;
          case ReduceOp::Prod:
            acc *= x;
            break;
          case ReduceOp::Max:
            acc = isSigned(type) ? (asSigned(x, type) > asSigned(acc, type) ? x : acc)
                                 : std::max(truncateBits(x, type), truncateBits(acc, type));
            break;
          case ReduceOp::Min:
            acc = isSigned(type) ? (asSigned(x, type) < asSigned(acc, type) ? x : acc)
                                 : std::min(truncateBits(x, type), truncateBits(acc, type));
            break;
        }
      }
      acc = truncateBits(acc, type);
      if (op == ReduceOp::Avg) {
        acc = isSigned(type)
                  ? truncateBits(static_cast<uint64_t>(asSigned(acc, type) / nranks), type)
                  : acc / static_cast<uint64_t>(nranks);
      }
      uint64_t have = truncateBits(loadBits(type, got, i), type);
      if (have != acc)
        return describe(type, op, index,
                        isSigned(type) ? static_cast<double>(asSigned(have, type)) : have,
                        isSigned(type) ? static_cast<double>(asSigned(acc, type)) : acc, 0);
      continue;
    }
    // long double: the reference's own rounding stays far below the bound.
    long double want = 0, magnitude = 0;
    for (int r = 0; r < nranks; ++r) {
      long double x = inputValue(type, op, seed, r, index);
      magnitude += std::fabs(x);
      if (r == 0) {
        want = x;
      } else if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
        want += x;
      } else if (op == ReduceOp::Prod) {
        want *= x;
      } else if (op == ReduceOp::Max) {
        want = std::max(want, x);
      } else {
        want = std::min(want, x);
      }
    }
    long double tolerance = 0;
    // gamma(k) = (1+u)^k - 1, computed without cancellation.
    long double gamma =
        std::expm1((nranks + 1) * std::log1p(static_cast<long double>(unitRoundoff(type))));
    if (op == ReduceOp::Sum) tolerance = gamma * magnitude;
    if (op == ReduceOp::Avg) want /= nranks, tolerance = gamma * magnitude / nranks;
    if (op == ReduceOp::Prod) tolerance = gamma * std::fabs(want);
    if (op != ReduceOp::Max && op != ReduceOp::Min)
      tolerance += (nranks + 1) * smallestSubnormal(type);
    long double have = load(type, got, i);
    if (!(std::fabs(have - want) <= tolerance))
      return describe(type, op, index, static_cast<double>(have), static_cast<double>(want),
                      static_cast<double>(tolerance));
  }
  return "";
}

std::string checkCopied(DataType type, ReduceOp op, uint64_t seed, int rank, size_t first,
                        size_t count, const void* got) {
  const size_t size = dataTypeSize(type);
  for (size_t i = 0; i < count; ++i) {
    unsigned char want[8];
    store(type, want, 0, inputValue(type, op, seed, rank, first + i));
    if (std::memcmp(want, static_cast<const unsigned char*>(got) + i * size, size) != 0)
      return describe(type, op, first + i, load(type, got, i), load(type, want, 0), 0) +
             " (from rank " + std::to_string(rank) + ")";
  }
  return "";
}

}  // namespace braid::testing
