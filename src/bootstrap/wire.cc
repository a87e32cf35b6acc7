#include "bootstrap/wire.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace braid::bootstrap::wire {

void Writer::address(const net::Address& address) {
  uint8_t bytes[16] = {};
  uint32_t scope = 0;
  if (address.family() == AF_INET) {
    u16(kFamilyV4);
    std::memcpy(bytes, &reinterpret_cast<const sockaddr_in*>(address.sockaddr_())->sin_addr, 4);
  } else {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(address.sockaddr_());
    u16(kFamilyV6);
    std::memcpy(bytes, &in6->sin6_addr, 16);
    scope = in6->sin6_scope_id;
  }
  u16(address.port());
  raw(bytes, sizeof(bytes));
  u32(scope);
}

net::Address Reader::address() {
  const uint64_t family = u16();
  const auto port = static_cast<uint16_t>(u16());
  const uint8_t* bytes = take(16);
  const auto scope = static_cast<uint32_t>(u32());
  net::Address address;
  if (family == kFamilyV4) {
    sockaddr_in in{};
    in.sin_family = AF_INET;
    std::memcpy(&in.sin_addr, bytes, 4);
    address = net::Address::fromSockaddr(reinterpret_cast<sockaddr*>(&in), sizeof(in));
  } else if (family == kFamilyV6) {
    sockaddr_in6 in6{};
    in6.sin6_family = AF_INET6;
    std::memcpy(&in6.sin6_addr, bytes, 16);
    in6.sin6_scope_id = scope;
    address = net::Address::fromSockaddr(reinterpret_cast<sockaddr*>(&in6), sizeof(in6));
  } else {
    throw ProtocolError("an address of unknown family");
  }
  address.setPort(port);
  return address;
}

FrameHeader decodeHeader(const std::array<uint8_t, kHeaderBytes>& bytes) {
  Reader reader(bytes.data(), bytes.size());
  if (reader.u32() != kFrameMagic) throw ProtocolError("not a braid connection (bad magic)");
  FrameHeader header;
  header.type = static_cast<uint32_t>(reader.u32());
  header.length = reader.u64();
  return header;
}

std::vector<uint8_t> encodeRefusal(ErrorCode code, const std::string& why) {
  Writer writer(kRefusalType);
  writer.u32(static_cast<uint32_t>(code));
  writer.raw(why.data(), std::min<size_t>(why.size(), kMaxRefusalBytes - 4));
  return writer.finish();
}

uint64_t payloadLimit(uint32_t type, int nranks) {
  switch (type) {
    case kRegisterType:
      return kMaxRegistrationBytes;
    case kTableType:
      return static_cast<uint64_t>(std::max(nranks, 0)) * kMaxTableBytesPerRank;
    case kRefusalType:
      return kMaxRefusalBytes;
  }
  return 0;
}

std::vector<uint8_t> encodeRegistration(uint64_t secret, int nranks, int rank,
                                        std::chrono::milliseconds timeout, const PeerInfo& self) {
  Writer writer(kRegisterType);
  writer.u64(secret);
  writer.u32(static_cast<uint32_t>(nranks));
  writer.u32(static_cast<uint32_t>(rank));
  writer.u32(static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, UINT32_MAX)));
  writer.address(self.listen);
  writer.text(self.hostId.substr(0, kMaxHostIdBytes));
  return writer.finish();
}

Registration decodeRegistration(const std::vector<uint8_t>& payload) {
  Reader reader(payload);
  Registration registration;
  registration.secret = reader.u64();
  registration.nranks = reader.u32();
  registration.rank = reader.u32();
  registration.timeout = std::chrono::milliseconds(reader.u32());
  registration.info.listen = reader.address();
  registration.info.hostId = reader.text(kMaxHostIdBytes);
  reader.expectEnd();
  if (registration.nranks < 1 || registration.nranks > kMaxRanks)
    throw ProtocolError(format("nranks %llu is out of range",
                               static_cast<unsigned long long>(registration.nranks)));
  return registration;
}

std::vector<PeerInfo> decodeTable(const std::vector<uint8_t>& payload, int nranks) {
  Reader reader(payload);
  const uint64_t count = reader.u32();
  if (count != static_cast<uint64_t>(nranks))
    throw ProtocolError(format("a table of %llu ranks for a job of %d",
                               static_cast<unsigned long long>(count), nranks));
  std::vector<PeerInfo> table(count);
  for (PeerInfo& peer : table) {
    peer.listen = reader.address();
    peer.hostId = reader.text(kMaxHostIdBytes);
  }
  reader.expectEnd();
  return table;
}

Refusal decodeRefusal(const std::vector<uint8_t>& payload) {
  Reader reader(payload);
  Refusal refusal{static_cast<ErrorCode>(reader.u32()), ""};
  refusal.why = reader.rest();
  return refusal;
}

}  // namespace braid::bootstrap::wire
