// NCCL's parameter API (ncclParam*, NCCL 2.30) over braid's knobs: each
// knob under its own name (BRAID_SLOT_BYTES) and, where it reads one, under
// NCCL's name too (NCCL_SOCKET_IFNAME for BRAID_SOCKET_IFNAME). A value is
// what a communicator made now without a Config would take: the braid
// name's variable, then NCCL's, then the default.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/knobs.h"
#include "core/log.h"
#include "nccl_compat/nccl_internal.h"

struct ncclParamHandle {
  const braid::KnobInfo* knob;
  const char* key;  // the knob's name, or its NCCL alias
};

namespace braid::nccl {
namespace {

// A handle per key, made once and kept for the process (NCCL's handles
// stay valid as long as the library is loaded).
const std::vector<ncclParamHandle>& handles() {
  static const std::vector<ncclParamHandle>* all = [] {
    auto* made = new std::vector<ncclParamHandle>;
    for (const KnobInfo& knob : knobTable()) {
      made->push_back({&knob, knob.name});
      if (knob.alias) made->push_back({&knob, knob.alias});
    }
    return made;
  }();
  return *all;
}

const ncclParamHandle* find(const char* key) {
  for (const ncclParamHandle& handle : handles())
    if (std::strcmp(handle.key, key) == 0) return &handle;
  return nullptr;
}

ncclResult_t unknownKey(const char* fn, const char* key) {
  return badArgument(fn, format("argument 'key' (\"%s\") names no parameter (braid-info --config "
                                "lists them)",
                                key));
}

// The knob's value as an integer: counts as they are, sizes in bytes and
// durations in milliseconds; text only where it is a whole number.
long long integerOf(const ncclParamHandle& handle, const char* fn) {
  const KnobInfo& knob = *handle.knob;
  const std::string text = knobText(knob.name);
  const std::string type = knob.type;
  if (type == "int") return parseInt(text, handle.key);
  if (type == "bytes") return static_cast<long long>(parseBytes(text, handle.key));
  if (type == "duration") return parseDuration(text, handle.key).count();
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 0);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: %s is \"%s\", not a number", fn, handle.key, text.c_str()));
  return value;
}

template <typename T>
ncclResult_t getInteger(const char* fn, ncclParamHandle_t h, T* out) {
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(h, fn, "h")) return bad;
    if (ncclResult_t bad = need(out, fn, "out")) return bad;
    const long long value = integerOf(*h, fn);
    const bool fits =
        std::numeric_limits<T>::is_signed
            ? value >= static_cast<long long>(std::numeric_limits<T>::min()) &&
                  value <= static_cast<long long>(std::numeric_limits<T>::max())
            : value >= 0 && static_cast<unsigned long long>(value) <= std::numeric_limits<T>::max();
    if (!fits)
      return badArgument(fn, format("%s is %lld, out of this type's range", h->key, value));
    *out = static_cast<T>(value);
    return ncclSuccess;
  });
}

}  // namespace
}  // namespace braid::nccl

using namespace braid::nccl;
using braid::format;

extern "C" {

NCCL_EXPORT ncclResult_t pncclParamBind(ncclParamHandle_t* out, const char* key) {
  const char* fn = "ncclParamBind";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(out, fn, "out")) return bad;
    if (ncclResult_t bad = need(key, fn, "key")) return bad;
    const ncclParamHandle* handle = find(key);
    if (!handle) return unknownKey(fn, key);
    *out = const_cast<ncclParamHandle*>(handle);
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclParamGetI8(ncclParamHandle_t h, int8_t* out) {
  return getInteger("ncclParamGetI8", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetI16(ncclParamHandle_t h, int16_t* out) {
  return getInteger("ncclParamGetI16", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetI32(ncclParamHandle_t h, int32_t* out) {
  return getInteger("ncclParamGetI32", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetI64(ncclParamHandle_t h, int64_t* out) {
  return getInteger("ncclParamGetI64", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetU8(ncclParamHandle_t h, uint8_t* out) {
  return getInteger("ncclParamGetU8", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetU16(ncclParamHandle_t h, uint16_t* out) {
  return getInteger("ncclParamGetU16", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetU32(ncclParamHandle_t h, uint32_t* out) {
  return getInteger("ncclParamGetU32", h, out);
}
NCCL_EXPORT ncclResult_t pncclParamGetU64(ncclParamHandle_t h, uint64_t* out) {
  return getInteger("ncclParamGetU64", h, out);
}

// Valid until this thread's next call.
NCCL_EXPORT ncclResult_t pncclParamGetStr(ncclParamHandle_t h, const char** out) {
  const char* fn = "ncclParamGetStr";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(h, fn, "h")) return bad;
    if (ncclResult_t bad = need(out, fn, "out")) return bad;
    thread_local std::string value;
    value = braid::knobText(h->knob->name);
    *out = value.c_str();
    return ncclSuccess;
  });
}

// A number's native form is an int64_t; text's, its characters and a NUL.
NCCL_EXPORT ncclResult_t pncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len) {
  const char* fn = "ncclParamGet";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(h, fn, "h")) return bad;
    if (ncclResult_t bad = need(len, fn, "len")) return bad;
    const std::string type = h->knob->type;
    std::string bytes;
    if (type == "int" || type == "bytes" || type == "duration") {
      const int64_t value = integerOf(*h, fn);
      bytes.assign(reinterpret_cast<const char*>(&value), sizeof(value));
    } else {
      bytes = braid::knobText(h->knob->name);
      bytes.push_back('\0');
    }
    *len = static_cast<int>(bytes.size());
    if (maxLen < *len)
      return badArgument(
          fn, format("argument 'maxLen' is %d; %s takes %d bytes", maxLen, h->key, *len));
    if (ncclResult_t bad = need(out, fn, "out")) return bad;
    std::memcpy(out, bytes.data(), bytes.size());
    return ncclSuccess;
  });
}

// Valid until this thread's next call.
NCCL_EXPORT ncclResult_t pncclParamGetParameter(const char* key, const char** value,
                                                int* valueLen) {
  const char* fn = "ncclParamGetParameter";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(key, fn, "key")) return bad;
    if (ncclResult_t bad = need(value, fn, "value")) return bad;
    const ncclParamHandle* handle = find(key);
    if (!handle) return unknownKey(fn, key);
    thread_local std::string text;
    text = braid::knobText(handle->knob->name);
    *value = text.c_str();
    if (valueLen) *valueLen = static_cast<int>(text.size());
    return ncclSuccess;
  });
}

// Every key: each knob's name, then its NCCL alias where it has one.
NCCL_EXPORT ncclResult_t pncclParamGetAllParameterKeys(const char*** table, int* tableLen) {
  const char* fn = "ncclParamGetAllParameterKeys";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(table, fn, "table")) return bad;
    if (ncclResult_t bad = need(tableLen, fn, "tableLen")) return bad;
    thread_local std::vector<const char*> keys;
    keys.clear();
    for (const ncclParamHandle& handle : handles()) keys.push_back(handle.key);
    *table = keys.data();
    *tableLen = static_cast<int>(keys.size());
    return ncclSuccess;
  });
}

// Each knob, its value, where the value came from and what it does, to
// braid's log output whatever its level (as braid-info --config prints
// them).
NCCL_EXPORT void pncclParamDumpAll(void) {
  try {
    for (const braid::KnobValue& knob : braid::Knobs::describe(braid::Config{}))
      braid::log::write(braid::log::Level::Info, braid::log::Subsys::Env,
                        "%s%s%s (%s) = \"%s\" [%s]: %s", knob.knob->name,
                        knob.knob->alias ? ", " : "", knob.knob->alias ? knob.knob->alias : "",
                        knob.knob->type, knob.value.c_str(), knob.source.c_str(), knob.knob->doc);
  } catch (const std::exception& error) {
    braid::log::write(braid::log::Level::Warn, braid::log::Subsys::Env, "ncclParamDumpAll: %s",
                      error.what());
  }
}

}  // extern "C"

#pragma GCC diagnostic ignored "-Wmissing-attributes"
NCCL_ALIAS(ncclResult_t, ParamBind, (ncclParamHandle_t * out, const char* key));
NCCL_ALIAS(ncclResult_t, ParamGetI8, (ncclParamHandle_t h, int8_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetI16, (ncclParamHandle_t h, int16_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetI32, (ncclParamHandle_t h, int32_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetI64, (ncclParamHandle_t h, int64_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetU8, (ncclParamHandle_t h, uint8_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetU16, (ncclParamHandle_t h, uint16_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetU32, (ncclParamHandle_t h, uint32_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetU64, (ncclParamHandle_t h, uint64_t* out));
NCCL_ALIAS(ncclResult_t, ParamGetStr, (ncclParamHandle_t h, const char** out));
NCCL_ALIAS(ncclResult_t, ParamGet, (ncclParamHandle_t h, void* out, int maxLen, int* len));
NCCL_ALIAS(ncclResult_t, ParamGetParameter, (const char* key, const char** value, int* valueLen));
NCCL_ALIAS(ncclResult_t, ParamGetAllParameterKeys, (const char*** table, int* tableLen));
NCCL_ALIAS(void, ParamDumpAll, (void));
