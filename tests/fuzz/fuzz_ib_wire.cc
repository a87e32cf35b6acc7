// libFuzzer target: the ibverbs connection info (transports/ibverbs/
// ib_wire.h), the record a peer sends before its QPs are connected. Every
// malformed input must end in Error(RemoteError), nothing else: no crash,
// no read past the input. What decodes must encode back to the same bytes
// (decode checks every byte) and decode again to the same struct.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "braid/error.h"
#include "transports/ibverbs/ib_wire.h"

using namespace braid::transport::ibverbs;

namespace {

void check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so a read past the input is caught.
  const std::vector<uint8_t> input(data, data + size);
  try {
    const EndpointInfo info = decode(input.data(), input.size());
    check(!info.qpNums.empty() && info.qpNums.size() <= kWireMaxQps &&
          info.psns.size() == info.qpNums.size() && info.slots >= 2 && info.slotBytes > 0);
    const std::vector<std::byte> again = encode(info);
    check(again.size() == size && again.size() == encodedSize(info.qpNums.size()));
    check(std::memcmp(again.data(), input.data(), size) == 0);
    check(decode(again.data(), again.size()) == info);
  } catch (const braid::Error& error) {
    check(error.code() == braid::ErrorCode::RemoteError);
  }
  return 0;
}
