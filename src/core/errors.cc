#include "core/errors.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace braid {

std::string listOfRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += format("%s%d", out.empty() ? "" : ", ", r);
  return out;
}

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int length = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(length > 0 ? static_cast<size_t>(length) : 0, '\0');
  if (length > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

void fail(ErrorCode code, int rank, const std::string& message) {
  throw Error(code, format("braid rank %d: %s", rank, message.c_str()));
}

void failSystem(int rank, const std::string& what, int errnum) {
  fail(ErrorCode::SystemError, rank, what + ": " + std::strerror(errnum));
}

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "invalid argument";
    case ErrorCode::InvalidUsage:
      return "invalid usage";
    case ErrorCode::SystemError:
      return "system error";
    case ErrorCode::RemoteError:
      return "remote error";
    case ErrorCode::Timeout:
      return "timeout";
    case ErrorCode::Aborted:
      return "aborted";
    case ErrorCode::Internal:
      return "internal error";
    case ErrorCode::Revoked:
      return "revoked";
  }
  return "unknown error";
}

}  // namespace braid
