// Runs one chaos trial from the driver (the process that forks the ranks):
// makes its hosts, forks its ranks, strikes its fault, and judges what
// the ranks report against what must hold.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chaos/trial.h"

namespace braid::chaos {

struct RunSettings {
  // Config::timeout of the ranks' communicators (creation included).
  std::chrono::milliseconds timeout{3000};
  // Where each rank's stderr goes: "<logDir>/seed-S-rank-R.log".
  std::string logDir;
  bool verbose = false;
};

enum class Result { Finished, FailedNamingCulprit, Violation };
const char* resultName(Result r);

struct Outcome {
  Result result = Result::Finished;
  std::vector<std::string> violations;  // why, one line each
  std::optional<int64_t> detectMs;      // fault to the last survivor's error
  bool faultMissed = false;             // every rank was done before it struck
  double seconds = 0;                   // the trial's wall time
  std::vector<std::string> details;     // per rank, for --verbose
  std::vector<std::string> logs;        // the ranks' stderr files, kept on a violation
};

Outcome runTrial(const Trial& trial, const RunSettings& settings);

// Removes every /dev/shm entry whose name starts with "braid-" and the
// secret's hex (segmentsOf in tests/communicator_test.cc) and returns their
// names.
std::vector<std::string> removeSegmentsOf(uint64_t secret);

}  // namespace braid::chaos
