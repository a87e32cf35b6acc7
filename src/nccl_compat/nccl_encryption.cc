// ncclSetEncryption (NCCL 2.32): the process-wide choice to encrypt the
// library's TCP sockets with TLS and a pre-shared key. braid's sockets are
// plaintext: the call checks its config as NCCL does, accepts plaintext,
// and refuses a key with ncclInvalidUsage (what an NCCL built without TLS
// answers) rather than let a caller believe its traffic is encrypted.
#include <cstddef>
#include <cstring>

#include "core/log.h"
#include "nccl_compat/nccl_internal.h"

namespace braid::nccl {
namespace {

// The shortest key NCCL takes, in bytes.
constexpr size_t kShortestKey = 32;

}  // namespace
}  // namespace braid::nccl

using namespace braid::nccl;

extern "C" {

NCCL_EXPORT ncclResult_t pncclSetEncryption(const ncclEncryptionConfig_t* config) {
  const char* fn = "ncclSetEncryption";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(config, fn, "config")) return bad;
    if (config->magic != NCCL_API_MAGIC)
      return badArgument(fn,
                         "argument 'config' was not made by NCCL_ENCRYPTION_CONFIG_INITIALIZER");
    constexpr size_t kWithMode = offsetof(ncclEncryptionConfig_t, mode) + sizeof(int);
    constexpr size_t kWithKey = offsetof(ncclEncryptionConfig_t, psk) + sizeof(const char*);
    if (config->size < kWithMode)
      return badArgument(fn, format("config->size is %zu: too small to hold 'mode'", config->size));
    const int mode = config->mode;
    if (mode == NCCL_ENCRYPTION_MODE_NONE) {
      BRAID_INFO(Init, "%s: plaintext sockets (braid's only kind)", fn);
      return ncclSuccess;
    }
    if (mode != NCCL_ENCRYPTION_MODE_PSK)
      return badArgument(fn, format("config->mode is %d, not NCCL_ENCRYPTION_MODE_NONE (0) or "
                                    "NCCL_ENCRYPTION_MODE_PSK (1)",
                                    mode));
    const char* key = config->size >= kWithKey ? config->psk : nullptr;
    if (!key) return badArgument(fn, "config->psk is NULL, and mode is NCCL_ENCRYPTION_MODE_PSK");
    if (std::strlen(key) < kShortestKey)
      return badArgument(fn, format("config->psk is %zu bytes long: a key has at least %zu",
                                    std::strlen(key), kShortestKey));
    return failWith(ncclInvalidUsage,
                    format("%s: braid does not encrypt its TCP sockets (they carry plaintext), so "
                           "it refuses a pre-shared key rather than send in the clear; run over "
                           "a network you trust, as with an NCCL built without TLS",
                           fn));
  });
}

}  // extern "C"

NCCL_ALIAS(ncclResult_t, SetEncryption, (const ncclEncryptionConfig_t* config));
