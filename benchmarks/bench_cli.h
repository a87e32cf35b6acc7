// Command-line and output helpers shared by braid-perf and the peer
// benchmarks (which are built without braid), so every table reads its
// sizes and prints its times the same way.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace braid::bench {

// A bad command line; what() is one line that names the option.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline long long intValue(const std::string& option, const std::string& text, long long lo,
                          long long hi) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0)
    throw UsageError(option + ": '" + text + "' is not an integer");
  if (value < lo || value > hi)
    throw UsageError(option + ": " + text + " is not between " + std::to_string(lo) + " and " +
                     std::to_string(hi));
  return value;
}

// "4096", "64K", "16M", "1G", also "16MB" and "16MiB", any case; at least 1.
inline size_t bytesValue(const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double number = std::strtod(text.c_str(), &end);
  std::string unit;
  for (const char* p = end; *p; ++p)
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();
  double scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k") {
    scale = 1024.0;
  } else if (unit == "m") {
    scale = 1024.0 * 1024;
  } else if (unit == "g") {
    scale = 1024.0 * 1024 * 1024;
  }
  // (NaN fails the range check too; a size beyond 8 EiB would overflow.)
  if (end == text.c_str() || errno != 0 || scale == 0 || !(number >= 1) ||
      !(number * scale < 9.0e18))
    throw UsageError(option + ": '" + text + "' is not a size such as 4096, 64K or 16M");
  return static_cast<size_t>(number * scale);
}

// minBytes, then times stepFactor (or plus stepBytes when it is > 0), up to
// maxBytes.
inline std::vector<size_t> sizeSteps(size_t minBytes, size_t maxBytes, size_t stepFactor,
                                     size_t stepBytes) {
  std::vector<size_t> sizes;
  for (size_t size = minBytes; size <= maxBytes;) {
    sizes.push_back(size);
    if (stepBytes > 0) {
      if (size > maxBytes - stepBytes) break;
      size += stepBytes;
    } else {
      if (size > maxBytes / stepFactor) break;
      size *= stepFactor;
    }
  }
  return sizes;
}

// A time in microseconds in at most 8 characters, as nccl-tests prints it.
inline std::string formatTime(double us) {
  char text[32];
  if (us < 1e4) {
    std::snprintf(text, sizeof(text), "%.2f", us);
  } else if (us < 1e5) {
    std::snprintf(text, sizeof(text), "%.1f", us);
  } else {
    std::snprintf(text, sizeof(text), "%.0f", us);
  }
  return text;
}

}  // namespace braid::bench
