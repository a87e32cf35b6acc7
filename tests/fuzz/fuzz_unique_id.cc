// libFuzzer target: UniqueId decoding, from raw bytes and from hex (as
// BRAID_UNIQUE_ID carries it). Anything that is not an id must end in
// braid::Error(InvalidArgument); an id that decodes must survive a round
// trip through hex.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "bootstrap/bootstrap.h"
#include "braid/error.h"
#include "braid/types.h"

namespace {

void check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  braid::UniqueId id;
  std::memcpy(id.bytes.data(), data, std::min(size, id.bytes.size()));
  try {
    const braid::bootstrap::IdContents contents = braid::bootstrap::decodeId(id);
    const braid::UniqueId again = braid::UniqueId::fromHex(id.toHex());
    check(again.bytes == id.bytes);
    check(braid::bootstrap::decodeId(again).secret == contents.secret);
  } catch (const braid::Error& error) {
    check(error.code() == braid::ErrorCode::InvalidArgument);
  }
  try {
    const braid::UniqueId parsed =
        braid::UniqueId::fromHex(std::string(reinterpret_cast<const char*>(data), size));
    check(parsed.toHex().size() == 2 * parsed.bytes.size());
  } catch (const braid::Error& error) {
    check(error.code() == braid::ErrorCode::InvalidArgument);
  }
  return 0;
}
