// Element types, reduction operators and the unique id that names a job.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace braid {

// The twelve element types, numbered as NCCL numbers ncclDataType_t.
enum class DataType : int {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Float16 = 6,
  Float32 = 7,
  Float64 = 8,
  BFloat16 = 9,
  Float8E4M3 = 10,
  Float8E5M2 = 11,
};
inline constexpr int kNumDataTypes = 12;

// Reduction operators, numbered as NCCL numbers ncclRedOp_t.
// Integer Sum and Prod wrap modulo 2^bits. Avg is Sum divided by the number of
// ranks (integer Avg truncates toward zero). Floating-point Max and Min return
// NaN when either operand is NaN.
enum class ReduceOp : int { Sum = 0, Prod = 1, Max = 2, Min = 3, Avg = 4 };
inline constexpr int kNumReduceOps = 5;

// Bytes per element. REQUIRES: isValid(type).
size_t dataTypeSize(DataType type);
// "float32", "bfloat16", ...; "invalid" for an out-of-range value.
const char* dataTypeName(DataType type);
// "sum", "prod", "max", "min", "avg"; "invalid" for an out-of-range value.
const char* reduceOpName(ReduceOp op);
bool isValid(DataType type);
bool isValid(ReduceOp op);
bool isFloatingPoint(DataType type);

// Names a job: the rendezvous address and a random job secret that every
// bootstrap connection must present. 128 bytes, like ncclUniqueId, so it can be
// shipped out of band (MPI_Bcast, a file, an environment variable) as raw bytes.
struct UniqueId {
  std::array<std::byte, 128> bytes{};

  // Lower-case hex, 256 characters; fromHex() throws braid::Error
  // (InvalidArgument) on anything that is not a valid id.
  std::string toHex() const;
  static UniqueId fromHex(const std::string& hex);
};

}  // namespace braid
