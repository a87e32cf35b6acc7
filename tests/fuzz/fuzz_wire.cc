// libFuzzer target: the rendezvous frames (bootstrap/wire.h). The first byte
// picks the decoder, the second the job's rank count for a table; the rest
// is the frame. Every malformed input must end in ProtocolError, nothing
// else: no crash, no read past the input, no allocation beyond the limits.
// What decodes must encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bootstrap/wire.h"

using namespace braid::bootstrap;
using namespace braid::bootstrap::wire;

namespace {

void check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 + kHeaderBytes) return 0;
  const uint8_t which = data[0] % 3;
  const int nranks = data[1] % 64 + 1;
  std::array<uint8_t, kHeaderBytes> head{};
  std::memcpy(head.data(), data + 2, kHeaderBytes);
  std::vector<uint8_t> payload(data + 2 + kHeaderBytes, data + size);
  try {
    const FrameHeader header = decodeHeader(head);
    const uint32_t type = which == 0 ? kRegisterType : which == 1 ? kTableType : kRefusalType;
    if (header.type != type || header.length != payload.size() ||
        header.length > payloadLimit(type, nranks))
      return 0;  // a receiver would stop here
    if (type == kRegisterType) {
      const Registration r = decodeRegistration(payload);
      check(r.nranks >= 1 && r.nranks <= kMaxRanks && r.info.hostId.size() <= kMaxHostIdBytes);
      const std::vector<uint8_t> again = encodeRegistration(
          r.secret, static_cast<int>(r.nranks), static_cast<int>(r.rank), r.timeout, r.info);
      const Registration back =
          decodeRegistration(std::vector<uint8_t>(again.begin() + kHeaderBytes, again.end()));
      check(back.secret == r.secret && back.nranks == r.nranks && back.rank == r.rank &&
            back.timeout == r.timeout && back.info.hostId == r.info.hostId &&
            back.info.listen.toString() == r.info.listen.toString());
    } else if (type == kTableType) {
      const std::vector<PeerInfo> table = decodeTable(payload, nranks);
      check(table.size() == static_cast<size_t>(nranks));
    } else {
      const Refusal refusal = decodeRefusal(payload);
      check(refusal.why.size() + 4 == payload.size());
    }
  } catch (const ProtocolError&) {
  }
  return 0;
}
