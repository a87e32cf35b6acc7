// ncclSetEncryption (NCCL 2.32): the process-wide choice to encrypt the
// library's TCP sockets with TLS and a pre-shared key. It sets braid's own
// choice (braid::setSocketSecret: TLS 1.3 through the tunnel of
// bootstrap/tls.h), after checking the config as NCCL does.
#include <cstddef>
#include <cstring>

#include "braid/config.h"
#include "core/log.h"
#include "nccl_compat/nccl_internal.h"

using namespace braid::nccl;

namespace {

// The shortest key NCCL takes, in bytes.
constexpr size_t kShortestKey = 32;

}  // namespace

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
      braid::setSocketSecret("");
      BRAID_INFO(Init, "%s: plaintext sockets", fn);
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
    braid::setSocketSecret(key);  // refuses a change once sockets exist, or a build without TLS
    BRAID_INFO(Init, "%s: TCP sockets carry TLS 1.3 with the pre-shared key", fn);
    return ncclSuccess;
  });
}

}  // extern "C"

NCCL_ALIAS(ncclResult_t, SetEncryption, (const ncclEncryptionConfig_t* config));
