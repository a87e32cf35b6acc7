// Building braid::Error messages with their context.
#pragma once

#include <string>

#include "braid/error.h"

namespace braid {

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Throws Error(code, "braid rank R: " + message).
[[noreturn]] void fail(ErrorCode code, int rank, const std::string& message);

// Throws Error(SystemError, ...) with strerror(errnum) appended.
[[noreturn]] void failSystem(int rank, const std::string& what, int errnum);

}  // namespace braid
