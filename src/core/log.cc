#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace braid::log {
namespace {

const char* const kSubsysNames[] = {"init", "bootstrap", "net", "exec", "coll", "env"};
constexpr int kNumSubsys = sizeof(kSubsysNames) / sizeof(kSubsysNames[0]);
const char* const kLevelNames[] = {"off", "warn", "info", "debug", "trace"};

struct Settings {
  Level level = Level::Warn;
  bool subsys[kNumSubsys];
  FILE* out = stderr;

  Settings() {
    for (bool& on : subsys) on = true;
    if (const char* text = std::getenv("BRAID_LOG_LEVEL"); text && *text) {
      for (int i = 0; i < 5; ++i)
        if (strcasecmp(text, kLevelNames[i]) == 0) level = static_cast<Level>(i);
    } else if (const char* nccl = std::getenv("NCCL_DEBUG"); nccl && *nccl) {
      if (strcasecmp(nccl, "INFO") == 0) level = Level::Info;
      if (strcasecmp(nccl, "TRACE") == 0) level = Level::Trace;
    }
    // A list of subsystems, or with a leading '^' the ones to leave out.
    // NCCL_DEBUG_SUBSYS's SHM and P2P stand for exec; "tcp", this
    // subsystem's name before the network transports shared it, for net.
    const char* filter = std::getenv("BRAID_LOG_SUBSYS");
    if (!filter || !*filter) filter = std::getenv("NCCL_DEBUG_SUBSYS");
    if (filter && *filter && strcasecmp(filter, "all") != 0) {
      const bool excluding = *filter == '^';
      for (bool& on : subsys) on = excluding;
      std::string list(filter + (excluding ? 1 : 0));
      size_t start = 0;
      while (start <= list.size()) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        std::string name = list.substr(start, end - start);
        if (strcasecmp(name.c_str(), "tcp") == 0) name = "net";
        if (strcasecmp(name.c_str(), "shm") == 0 || strcasecmp(name.c_str(), "p2p") == 0)
          name = "exec";
        for (int i = 0; i < kNumSubsys; ++i)
          if (strcasecmp(name.c_str(), kSubsysNames[i]) == 0) subsys[i] = !excluding;
        start = end + 1;
      }
    }
    if (const char* path = std::getenv("BRAID_LOG_FILE"); path && *path) {
      std::string name(path);  // "%p" becomes the pid, so ranks do not share a file
      if (size_t at = name.find("%p"); at != std::string::npos)
        name.replace(at, 2, std::to_string(getpid()));
      if (FILE* file = std::fopen(name.c_str(), "a")) out = file;
    }
  }
};

std::mutex gWriteMutex;

// The settings in force. A reload replaces them; those replaced stay
// allocated (a thread may be reading them), and their file is closed.
std::atomic<Settings*>& current() {
  static std::atomic<Settings*> settings{new Settings};
  return settings;
}

Settings& settings() { return *current().load(std::memory_order_acquire); }

std::atomic<int> gRank{-1};

}  // namespace

bool enabled(Level level, Subsys subsys) {
  const Settings& s = settings();
  return level <= s.level && s.subsys[static_cast<int>(subsys)];
}

void reload() {
  auto* fresh = new Settings;
  std::lock_guard<std::mutex> lock(gWriteMutex);
  Settings* old = current().exchange(fresh, std::memory_order_acq_rel);
  if (old->out != stderr) std::fclose(old->out);
  old->out = stderr;
  static auto* retired = new std::vector<Settings*>;  // kept: a reader may hold one still
  retired->push_back(old);
}

void setRank(int rank) {
  int unset = -1;
  gRank.compare_exchange_strong(unset, rank);
}

void write(Level level, Subsys subsys, const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  std::lock_guard<std::mutex> lock(gWriteMutex);
  Settings& s = settings();  // (after the lock: a reload may close the file before)
  std::fprintf(s.out, "braid[rank %d pid %d %s] %s: %s\n", gRank.load(), static_cast<int>(getpid()),
               kSubsysNames[static_cast<int>(subsys)], kLevelNames[static_cast<int>(level)],
               message);
  std::fflush(s.out);
}

}  // namespace braid::log
