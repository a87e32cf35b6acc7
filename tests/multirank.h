// Multi-rank tests: fork N processes that meet through a real UniqueId, run a
// body on each, and report which rank failed and why. Every run has a
// deadline; a rank still running then is killed and reported as hung.
#pragma once

#include <sys/mman.h>

#include <chrono>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace braid::testing {

// Thrown by require() inside a rank; the harness reports its message.
struct RankFailure {
  std::string message;
};

// Fails the current rank with `message` unless `condition` holds.
void require(bool condition, const std::string& message);

// Runs `call`, which must throw braid::Error with `code` and a message that
// contains `needle`; fails the current rank otherwise.
template <typename Call>
void requireError(Call call, ErrorCode code, const std::string& needle) {
  try {
    call();
  } catch (const Error& error) {
    require(error.code() == code, std::string("wrong error code for: ") + error.what());
    require(std::string(error.what()).find(needle) != std::string::npos,
            "message '" + std::string(error.what()) + "' does not mention '" + needle + "'");
    return;
  }
  throw RankFailure{"expected an error mentioning '" + needle + "', got none"};
}

struct RunOptions {
  // Ranks still running this long after they started hung. BRAID_TEST_DEADLINE
  // (seconds) lowers it, for a run with little time to lose on a hang.
  std::chrono::seconds deadline{120};
  Config config = loopbackConfig();
  // Ranks listed here are not started (to test a rank that never shows up).
  std::vector<int> absent;
  // Ranks listed here are expected to die by SIGKILL (to test peer death).
  std::vector<int> killed;
  // The job id; empty has the first rank make one (after enter(), so inside
  // its namespace) with `idConfig`, or `config` when that is empty.
  std::optional<UniqueId> id;
  std::optional<Config> idConfig;
  // Runs first in each rank's process (e.g. to enter a network namespace).
  std::function<void(int rank)> enter;

  static Config loopbackConfig() {
    Config config;
    config.socketIfname = "lo";
    return config;
  }
};

// Runs body(comm) on each of `nranks` forked ranks and records a GoogleTest
// failure per rank that threw, failed a require(), exited or hung.
void runRanks(int nranks, const std::function<void(Communicator&)>& body,
              const RunOptions& options = {});

// Like runRanks, but the body makes (or fails to make) its own communicator
// from the id: for tests of init itself.
void runProcesses(int nranks,
                  const std::function<void(int rank, const UniqueId& id, const Config&)>& body,
                  const RunOptions& options = {});

// Runs `ask` in a forked child and returns what it says (or what it threw):
// for questions whose answer would start threads or load libraries in the
// process that forks the ranks (the harness must not).
std::string askInChild(const std::function<std::string()>& ask);

// What this process writes to stderr (where braid logs) while `body` runs;
// `body`'s exception is rethrown after stderr is back.
std::string captureStderr(const std::function<void()>& body);

// A T in memory the forked ranks share with this process, value-initialized
// (T's members must be lock-free atomics or plain data).
template <typename T>
class SharedWithRanks {
 public:
  SharedWithRanks()
      : memory_(
            ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) {
    if (memory_ == MAP_FAILED) throw std::runtime_error("mmap of shared test memory failed");
    value_ = new (memory_) T{};
  }
  ~SharedWithRanks() { ::munmap(memory_, sizeof(T)); }
  T* operator->() { return value_; }
  T* get() { return value_; }

 private:
  void* memory_;
  T* value_;
};

}  // namespace braid::testing
