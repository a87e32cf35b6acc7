#include "braid/types.h"

#include "braid/error.h"

namespace braid {

bool isValid(DataType type) {
  int v = static_cast<int>(type);
  return v >= 0 && v < kNumDataTypes;
}

bool isValid(ReduceOp op) {
  int v = static_cast<int>(op);
  return v >= 0 && v < kNumReduceOps;
}

size_t dataTypeSize(DataType type) {
  switch (type) {
    case DataType::Int8:
    case DataType::Uint8:
    case DataType::Float8E4M3:
    case DataType::Float8E5M2:
      return 1;
    case DataType::Float16:
    case DataType::BFloat16:
      return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64:
      return 8;
  }
  return 0;
}

const char* dataTypeName(DataType type) {
  static const char* const kNames[] = {"int8",    "uint8",    "int32",   "uint32",
                                       "int64",   "uint64",   "float16", "float32",
                                       "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return isValid(type) ? kNames[static_cast<int>(type)] : "invalid";
}

const char* reduceOpName(ReduceOp op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return isValid(op) ? kNames[static_cast<int>(op)] : "invalid";
}

bool isFloatingPoint(DataType type) {
  switch (type) {
    case DataType::Float16:
    case DataType::Float32:
    case DataType::Float64:
    case DataType::BFloat16:
    case DataType::Float8E4M3:
    case DataType::Float8E5M2:
      return true;
    default:
      return false;
  }
}

std::string UniqueId::toHex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    auto v = static_cast<unsigned>(b);
    out.push_back(kDigits[v >> 4]);
    out.push_back(kDigits[v & 15]);
  }
  return out;
}

UniqueId UniqueId::fromHex(const std::string& hex) {
  UniqueId id;
  if (hex.size() != id.bytes.size() * 2)
    throw Error(ErrorCode::InvalidArgument,
                "braid: UniqueId hex must be 256 characters, got " + std::to_string(hex.size()));
  auto digit = [&](char c) -> unsigned {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(ErrorCode::InvalidArgument,
                std::string("braid: UniqueId hex has a non-hex character '") + c + "'");
  };
  for (size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<std::byte>(digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]));
  return id;
}

}  // namespace braid
