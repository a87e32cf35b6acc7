#include "transports/ibverbs/ib_wire.h"

#include <cstring>
#include <string>

#include "core/errors.h"

namespace braid::transport::ibverbs {

namespace {

bool validMtu(uint32_t mtu) { return mtu >= 256 && mtu <= 4096 && (mtu & (mtu - 1)) == 0; }

// Bytes appended little-endian, whatever the host's order.
class Writer {
 public:
  explicit Writer(size_t bytes) { out_.reserve(bytes); }
  void put(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>(value >> (8 * i)));
  }
  void putRaw(const uint8_t* data, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>(data[i]));
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Reads fields in order; a field that does not fit is reported by name.
class Reader {
 public:
  Reader(const void* data, size_t bytes) : data_(static_cast<const uint8_t*>(data)), size_(bytes) {}

  uint64_t get(int bytes, const std::string& field) {
    need(static_cast<size_t>(bytes), field);
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i)
      value |= uint64_t{data_[at_ + static_cast<size_t>(i)]} << (8 * i);
    at_ += static_cast<size_t>(bytes);
    return value;
  }
  void getRaw(uint8_t* out, size_t bytes, const std::string& field) {
    need(bytes, field);
    std::memcpy(out, data_ + at_, bytes);
    at_ += bytes;
  }
  size_t left() const { return size_ - at_; }

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(
        ErrorCode::RemoteError,
        format("ibverbs connection info from the peer (%zu bytes): %s", size_, why.c_str()));
  }

 private:
  void need(size_t bytes, const std::string& field) const {
    if (size_ - at_ < bytes)
      fail(format("truncated at %s (the field needs %zu bytes from offset %zu)", field.c_str(),
                  bytes, at_));
  }

  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace

bool EndpointInfo::operator==(const EndpointInfo& other) const {
  return lid == other.lid && gid == other.gid && useGid == other.useGid && mtu == other.mtu &&
         qpNums == other.qpNums && psns == other.psns && fifoAddress == other.fifoAddress &&
         fifoRkey == other.fifoRkey && slots == other.slots && slotBytes == other.slotBytes;
}

std::vector<std::byte> encode(const EndpointInfo& info) {
  const char* wrong = nullptr;
  if (info.qpNums.empty() || info.qpNums.size() > kWireMaxQps)
    wrong = "QP count must be 1..16";
  else if (info.psns.size() != info.qpNums.size())
    wrong = "qpNums and psns differ in length";
  else if (!validMtu(info.mtu))
    wrong = "mtu must be 256, 512, 1024, 2048 or 4096";
  else if (info.slots < 2)
    wrong = "fewer than 2 slots";
  else if (info.slotBytes == 0)
    wrong = "slotBytes is 0";
  if (wrong)
    throw Error(
        ErrorCode::Internal,
        format("ibverbs connection info to encode (%zu QPs, %zu PSNs, mtu %u, %u slots of "
               "%u bytes): %s",
               info.qpNums.size(), info.psns.size(), info.mtu, info.slots, info.slotBytes, wrong));

  const size_t qps = info.qpNums.size();
  Writer out(encodedSize(qps));
  out.put(kWireMagic, 4);
  out.put(kWireVersion, 2);
  out.put(qps, 2);
  out.put(info.lid, 2);
  out.put(info.useGid ? 1 : 0, 1);
  out.put(0, 1);
  out.putRaw(info.gid.raw.data(), info.gid.raw.size());
  out.put(info.mtu, 4);
  out.put(info.fifoAddress, 8);
  out.put(info.fifoRkey, 4);
  out.put(info.slots, 4);
  out.put(info.slotBytes, 4);
  for (uint32_t qpNum : info.qpNums) out.put(qpNum, 4);
  for (uint32_t psn : info.psns) out.put(psn, 4);
  return out.take();
}

EndpointInfo decode(const void* data, size_t bytes) {
  Reader in(data, bytes);
  const uint32_t magic = static_cast<uint32_t>(in.get(4, "magic"));
  if (magic != kWireMagic)
    in.fail(format("wrong magic 0x%08x (expected 0x%08x): not ibverbs connection info", magic,
                   kWireMagic));
  const uint16_t version = static_cast<uint16_t>(in.get(2, "version"));
  if (version != kWireVersion)
    in.fail(format("version %u, where this build speaks version %u only", version, kWireVersion));
  const size_t qps = static_cast<size_t>(in.get(2, "the QP count"));
  if (qps == 0 || qps > kWireMaxQps)
    in.fail(format("QP count %zu, not in 1..%zu", qps, kWireMaxQps));

  EndpointInfo info;
  info.lid = static_cast<uint16_t>(in.get(2, "lid"));
  const uint64_t useGid = in.get(1, "useGid");
  if (useGid > 1) in.fail(format("useGid is %u, not 0 or 1", static_cast<unsigned>(useGid)));
  info.useGid = useGid == 1;
  const uint64_t reserved = in.get(1, "the reserved byte");
  if (reserved != 0)
    in.fail(format("the reserved byte is %u, not 0", static_cast<unsigned>(reserved)));
  in.getRaw(info.gid.raw.data(), info.gid.raw.size(), "gid");
  info.mtu = static_cast<uint32_t>(in.get(4, "mtu"));
  if (!validMtu(info.mtu)) in.fail(format("mtu %u, not 256, 512, 1024, 2048 or 4096", info.mtu));
  info.fifoAddress = in.get(8, "fifoAddress");
  info.fifoRkey = static_cast<uint32_t>(in.get(4, "fifoRkey"));
  info.slots = static_cast<uint32_t>(in.get(4, "slots"));
  if (info.slots < 2) in.fail(format("%u slots, fewer than 2", info.slots));
  info.slotBytes = static_cast<uint32_t>(in.get(4, "slotBytes"));
  if (info.slotBytes == 0) in.fail("slotBytes is 0");
  info.qpNums.resize(qps);
  info.psns.resize(qps);
  for (size_t i = 0; i < qps; ++i)
    info.qpNums[i] = static_cast<uint32_t>(in.get(4, format("qpNums[%zu]", i)));
  for (size_t i = 0; i < qps; ++i)
    info.psns[i] = static_cast<uint32_t>(in.get(4, format("psns[%zu]", i)));
  if (in.left() != 0)
    in.fail(format("%zu bytes after the last field (it says %zu QPs: %zu bytes)", in.left(), qps,
                   encodedSize(qps)));
  return info;
}

}  // namespace braid::transport::ibverbs
