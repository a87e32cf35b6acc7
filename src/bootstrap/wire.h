// The rendezvous protocol's frames, as bytes: encoding and checked decoding,
// apart from any socket so that they can be fuzzed (tests/fuzz).
//
// A frame is a 16-byte header {u32 magic "BRDR", u32 type, u64 payload
// length}, little-endian, then the payload. A receiver checks the length
// against payloadLimit() before it allocates anything.
//   Register  rank -> root  {u64 secret, u32 nranks, u32 rank,
//                            u32 remaining timeout ms, address, host id}   at most 4 KiB
//   Table     root -> rank  {u32 nranks, nranks x (address, host id)}      at most nranks x 4 KiB
//   Refusal   root -> rank  {u32 error code, message}                      at most 16 KiB
// An address is {u16 family (4 or 6), u16 port, 16 bytes in network order,
// u32 IPv6 scope id}; a host id is {u16 length, bytes}, at most 1 KiB.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "braid/error.h"
#include "core/errors.h"

namespace braid::bootstrap::wire {

constexpr uint32_t kFrameMagic = 0x52445242;  // "BRDR"
constexpr uint32_t kRegisterType = 1;
constexpr uint32_t kTableType = 2;
constexpr uint32_t kRefusalType = 3;
constexpr size_t kHeaderBytes = 16;

constexpr uint32_t kMaxRanks = 1u << 20;
constexpr uint64_t kMaxRegistrationBytes = 4096;
constexpr uint64_t kMaxTableBytesPerRank = 4096;
constexpr uint64_t kMaxRefusalBytes = 16384;
constexpr size_t kMaxHostIdBytes = 1024;
constexpr uint16_t kFamilyV4 = 4;
constexpr uint16_t kFamilyV6 = 6;

// A frame that breaks the protocol, or a connection the root gives up on.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds one frame: the header, then the payload appended field by field.
class Writer {
 public:
  explicit Writer(uint32_t type) : bytes_(kHeaderBytes) {
    store(0, kFrameMagic, 4);
    store(4, type, 4);
  }

  void u16(uint64_t value) { append(value, 2); }
  void u32(uint64_t value) { append(value, 4); }
  void u64(uint64_t value) { append(value, 8); }
  void raw(const void* data, size_t bytes) {
    auto* begin = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), begin, begin + bytes);
  }
  void text(const std::string& value) {
    u16(value.size());
    raw(value.data(), value.size());
  }
  void address(const net::Address& address);

  // The frame, with the payload length in its header.
  std::vector<uint8_t> finish() {
    store(8, bytes_.size() - kHeaderBytes, 8);
    return std::move(bytes_);
  }

 private:
  void store(size_t at, uint64_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) bytes_[at + i] = static_cast<uint8_t>(value >> (8 * i));
  }
  void append(uint64_t value, size_t bytes) {
    bytes_.resize(bytes_.size() + bytes);
    store(bytes_.size() - bytes, value, bytes);
  }

  std::vector<uint8_t> bytes_;
};

// Reads a payload field by field; throws ProtocolError instead of reading past
// its end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit Reader(const std::vector<uint8_t>& payload) : Reader(payload.data(), payload.size()) {}

  uint64_t u16() { return load(2); }
  uint64_t u32() { return load(4); }
  uint64_t u64() { return load(8); }
  std::string text(size_t limit) {
    size_t length = u16();
    if (length > limit) throw ProtocolError(format("a string of %zu bytes", length));
    const uint8_t* begin = take(length);
    return std::string(begin, begin + length);
  }
  std::string rest() {
    size_t length = size_ - at_;
    const uint8_t* begin = take(length);
    return std::string(begin, begin + length);
  }
  net::Address address();
  void expectEnd() const {
    if (at_ != size_) throw ProtocolError("trailing bytes");
  }

 private:
  const uint8_t* take(size_t bytes) {
    if (bytes > size_ - at_) throw ProtocolError("truncated frame");
    const uint8_t* begin = data_ + at_;
    at_ += bytes;
    return begin;
  }
  uint64_t load(size_t bytes) {
    const uint8_t* begin = take(bytes);
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(begin[i]) << (8 * i);
    return value;
  }

  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct FrameHeader {
  uint32_t type;
  uint64_t length;
};

FrameHeader decodeHeader(const std::array<uint8_t, kHeaderBytes>& bytes);

// The most payload bytes a frame of `type` may carry in a job of `nranks`;
// 0 for a type nobody sends.
uint64_t payloadLimit(uint32_t type, int nranks);

std::vector<uint8_t> encodeRegistration(uint64_t secret, int nranks, int rank,
                                        std::chrono::milliseconds timeout, const PeerInfo& self);

// A registration's fields. Throws ProtocolError for a malformed payload or
// an nranks out of [1, kMaxRanks] (rank is checked by the root, which
// refuses it in words).
struct Registration {
  uint64_t secret = 0;
  uint64_t nranks = 0;
  uint64_t rank = 0;
  std::chrono::milliseconds timeout{0};
  PeerInfo info;
};
Registration decodeRegistration(const std::vector<uint8_t>& payload);

// Throws ProtocolError unless the table has exactly `nranks` well-formed entries.
std::vector<PeerInfo> decodeTable(const std::vector<uint8_t>& payload, int nranks);

std::vector<uint8_t> encodeRefusal(ErrorCode code, const std::string& why);
struct Refusal {
  ErrorCode code;
  std::string why;
};
Refusal decodeRefusal(const std::vector<uint8_t>& payload);

}  // namespace braid::bootstrap::wire
