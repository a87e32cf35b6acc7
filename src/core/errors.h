// Building braid::Error messages with their context.
#pragma once

#include <string>
#include <vector>

#include "braid/error.h"

namespace braid {

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "1, 3, 4": ranks as a message lists them.
std::string listOfRanks(const std::vector<int>& ranks);

// Throws Error(code, "braid rank R: " + message).
[[noreturn]] void fail(ErrorCode code, int rank, const std::string& message);

// Throws Error(SystemError, ...) with strerror(errnum) appended.
[[noreturn]] void failSystem(int rank, const std::string& what, int errnum);

}  // namespace braid
