#include "chaos/run_trial.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <stdexcept>
#include <thread>

#include "chaos/rank.h"
#include "core/errors.h"
#include "multirank.h"
#include "netns_hosts.h"

namespace braid::chaos {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// How long the harness lets a trial's ranks run before it reports the ones
// still running as hung: two creations, the ops, a lingering wait, a
// closing barrier and the teardown, each far inside this.
constexpr seconds kDeadline{90};
// An op that has run this long when the fault is due is taken for stuck.
constexpr int64_t kStalledNs = 1'000'000'000;

// Whether braid's message names one of `ranks` the way its errors name the
// rank at fault.
bool namesAny(const std::string& message, const std::vector<int>& ranks) {
  static const char* const kNamings[] = {"peer %d ", "rank %d failed", "rank %d stopped answering",
                                         "from rank %d\\b", "for rank %d to"};
  for (int r : ranks)
    for (const char* naming : kNamings)
      if (std::regex_search(message, std::regex(format(naming, r)))) return true;
  return false;
}

std::string listOf(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i)
    text += (i == 0 ? "" : i + 1 == ranks.size() ? " or " : ", ") + std::to_string(ranks[i]);
  return text;
}

// Runs `command` in host `host`'s namespace.
void inHost(const testing::NamespaceHosts& hosts, int host, const std::string& command) {
  const std::string line = "ip netns exec " + hosts.name(host) + " " + command + " >/dev/null 2>&1";
  if (std::system(line.c_str()) != 0)
    std::fprintf(stderr, "braid_chaos: '%s' failed\n", line.c_str());
}

// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' dead but
// not reaped), or 0 where the process is gone.
char stateOf(pid_t pid) {
  char state = 0;
  if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r")) {
    // "pid (comm) S ...": the state follows the last ')'.
    char line[512] = {};
    if (std::fgets(line, sizeof(line), f))
      if (const char* close = std::strrchr(line, ')'); close && close[1] == ' ') state = close[2];
    std::fclose(f);
  }
  return state;
}

// The driver's side of the fault: waits until every rank passed its first
// barrier, then for the trial's moment, then strikes; a stopped rank is
// killed once every other rank reported (or long after the timeout). It
// strikes from a process of its own, forked before the ranks: a thread
// here would make the ranks children of a multi-threaded process, which
// ThreadSanitizer cannot follow.
class Striker {
 public:
  Striker(const Trial& trial, SharedState* shared, const testing::NamespaceHosts* hosts,
          milliseconds timeout)
      : trial_(trial), shared_(shared), hosts_(hosts), timeout_(timeout) {
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork of the fault process failed");
    if (pid_ == 0) {
      run();
      ::_exit(0);  // nothing of the driver's (its hosts above all) is torn down here
    }
  }
  ~Striker() { finish(); }
  // Once the ranks' processes are gone.
  void finish() {
    shared_->ranksGone.store(1);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  // Sleeps until `done` or until the ranks are gone; false if they went.
  template <typename Done>
  bool waitFor(Done done, steady_clock::time_point until) {
    while (!done()) {
      if (shared_->ranksGone.load() || steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  Phase phaseOf(int rank) const { return static_cast<Phase>(shared_->ranks[rank].phase.load()); }

  void run() {
    const int n = trial_.nranks;
    const bool allPast =
        waitFor([&] { return shared_->pastBarrier.load() == n; }, steady_clock::now() + kDeadline);
    if (!allPast || trial_.fault == Fault::None) {
      shared_->faultOver.store(1);
      return;
    }
    const auto at = steady_clock::now() + trial_.moment;
    if (!waitFor([&] { return steady_clock::now() >= at; }, at + seconds(1))) {
      shared_->faultMissed.store(1);  // every rank's process is gone
      shared_->faultOver.store(1);
      return;
    }
    // A fault must not hide a hang: while a rank has been in one op for
    // more than a second (the longest op of fault-free trials on the 2-core
    // CI machine took 0.85 s), the fault waits until the op ends, of itself
    // or by its timeout, which then fails the trial. (A hang that began
    // less than a second before the fault still passes for its effect: the
    // fault-free trials find those.)
    waitFor(
        [&] {
          for (int r = 0; r < n; ++r) {
            const int64_t start = shared_->ranks[r].opStartNs.load();
            if (start && nowNs() - start > kStalledNs) return false;
          }
          return true;
        },
        steady_clock::now() + timeout_ + seconds(3));
    bool anyLeft = false;
    for (int r = 0; r < n; ++r) anyLeft = anyLeft || phaseOf(r) != Phase::Reported;
    shared_->faultMissed.store(!anyLeft);
    shared_->faultAtNs.store(nowNs());
    const std::vector<int> victims = trial_.victims();
    auto killRank = [&](int rank, int signal) {
      // A rank that reported is leaving of itself (its pid may be gone).
      if (phaseOf(rank) == Phase::Reported) return false;
      ::kill(shared_->ranks[rank].pid.load(), signal);
      return true;
    };
    // The fault is over for the ranks (faultOver) once it took effect: a
    // rank that lingers waits for it before its closing barrier, which must
    // not pass with a victim that was still about to go.
    // (A process that is gone, state 0, has passed every state.)
    auto until = [&](pid_t pid, const char* states) {
      waitFor([&] { return std::strchr(states, stateOf(pid)) != nullptr; },
              steady_clock::now() + seconds(1));
    };
    bool stopped = false;
    switch (trial_.fault) {
      case Fault::None:
        break;
      case Fault::Kill:
        if (killRank(trial_.victim, SIGKILL)) until(shared_->ranks[trial_.victim].pid, "Z");
        break;
      case Fault::Stop:
        stopped = killRank(trial_.victim, SIGSTOP);
        if (stopped) until(shared_->ranks[trial_.victim].pid, "tT");
        break;
      case Fault::Abort:
        shared_->abortNow.store(1);
        waitFor([&] { return shared_->aborted.load() || phaseOf(trial_.victim) >= Phase::Ended; },
                steady_clock::now() + seconds(1));
        break;
      case Fault::LinkDown:
        inHost(*hosts_, trial_.victimHost, "ip link set eth0 down");
        break;
      case Fault::Partition:
        for (int h = 0; h < trial_.hosts; ++h) {
          if (h == trial_.victimHost) continue;
          inHost(*hosts_, trial_.victimHost,
                 "ip route add blackhole " + testing::NamespaceHosts::address(h) + "/32");
          inHost(*hosts_, h,
                 "ip route add blackhole " + testing::NamespaceHosts::address(trial_.victimHost) +
                     "/32");
        }
        break;
      case Fault::TornDown:
        inHost(*hosts_, trial_.victimHost, "ip link del eth0");
        for (int r : victims)
          if (killRank(r, SIGKILL)) until(shared_->ranks[r].pid, "Z");
        break;
    }
    shared_->faultOver.store(1);
    if (stopped) {
      waitFor(
          [&] {
            for (int r = 0; r < n; ++r)
              if (r != trial_.victim && phaseOf(r) != Phase::Reported) return false;
            return true;
          },
          steady_clock::now() + timeout_ + seconds(20));
      ::kill(shared_->ranks[trial_.victim].pid.load(), SIGKILL);
    }
  }

  const Trial& trial_;
  SharedState* shared_;
  const testing::NamespaceHosts* hosts_;
  const milliseconds timeout_;
  pid_t pid_ = -1;
};

std::string firstLines(const std::string& text, size_t lines) {
  size_t at = 0;
  for (size_t i = 0; i < lines && at != std::string::npos; ++i) {
    at = text.find('\n', at);
    if (at != std::string::npos) ++at;
  }
  return at == std::string::npos ? text : text.substr(0, at) + "[...]";
}

// Names of the namespaces this process made that are still there.
std::vector<std::string> leftoverNamespaces() {
  const std::string prefix = "braid" + std::to_string(::getpid());
  std::vector<std::string> left;
  if (FILE* list = ::popen("ip netns list 2>/dev/null", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), list)) {
      std::string name = line;
      name = name.substr(0, name.find_first_of(" \n"));
      if (name.rfind(prefix, 0) == 0) left.push_back(name);
    }
    ::pclose(list);
  }
  return left;
}

}  // namespace

const char* resultName(Result r) {
  switch (r) {
    case Result::Finished:
      return "finished";
    case Result::FailedNamingCulprit:
      return "failed-naming-culprit";
    case Result::Violation:
      return "VIOLATION";
  }
  return "?";
}

std::vector<std::string> removeSegmentsOf(uint64_t secret) {
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "braid-%016llx", static_cast<unsigned long long>(secret));
  std::vector<std::string> found;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* entry = ::readdir(dir))
      if (std::string(entry->d_name).rfind(prefix, 0) == 0) found.push_back(entry->d_name);
    ::closedir(dir);
  }
  for (const std::string& name : found) ::unlink(("/dev/shm/" + name).c_str());
  return found;
}

Outcome runTrial(const Trial& trial, const RunSettings& settings) {
  const auto started = steady_clock::now();
  Outcome outcome;
  auto violation = [&](const std::string& why) { outcome.violations.push_back(why); };

  std::optional<testing::NamespaceHosts> hosts;
  if (trial.hosts > 1) {
    hosts.emplace(trial.hosts);
    if (!hosts->ready()) {
      violation("the namespace hosts could not be made: " + hosts->why());
      outcome.result = Result::Violation;
      return outcome;
    }
  }

  testing::RunOptions options;
  options.deadline = kDeadline;
  options.config.timeout = settings.timeout;
  Config idConfig = options.config;
  if (hosts) {
    // As between machines: the root in the first rank's host on its eth0,
    // every rank on the interface that routes to it.
    idConfig.socketIfname = "eth0";
    options.config.socketIfname = "";
    if (trial.transport == Transport::Device) options.config.transports = "shm,tcp";
  }
  options.idConfig = idConfig;
  for (int r : trial.victims())
    if (trial.fault != Fault::Abort) options.killed.push_back(r);
  std::vector<std::string> logs;
  for (int r = 0; r < trial.nranks; ++r)
    logs.push_back(settings.logDir + format("/seed-%llu-rank-%d.log",
                                            static_cast<unsigned long long>(trial.seed), r));
  options.enter = [&](int rank) {
    const int fd = ::open(logs[rank].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    if (hosts) hosts->enter(trial.hostOf[rank]);
    enterTransport(trial);
  };

  testing::SharedWithRanks<SharedState> shared;
  SharedState* state = shared.operator->();
  ::testing::TestPartResultArray harness;
  {
    Striker striker(trial, state, hosts ? &*hosts : nullptr, settings.timeout);
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &harness);
    testing::runProcesses(
        trial.nranks,
        [&](int rank, const UniqueId& id, const Config& config) {
          runRank(trial, rank, id, config, idConfig, state);
        },
        options);
    striker.finish();
  }
  outcome.faultMissed = state->faultMissed.load() != 0;

  // What the harness saw: a rank that hung, died of a signal it was not
  // meant to, or threw something else than a braid::Error.
  for (int i = 0; i < harness.size(); ++i) {
    std::string message = harness.GetTestPartResult(i).message();
    if (message.rfind("Failed\n", 0) == 0) message = message.substr(7);
    violation("harness: " + firstLines(message, 40));
  }

  const int64_t faultAt = state->faultAtNs.load();
  const std::vector<int> victims = trial.victims();
  const int64_t bound =
      std::chrono::duration_cast<std::chrono::nanoseconds>(settings.timeout + seconds(2)).count();
  int64_t detect = -1;
  for (int r = 0; r < trial.nranks; ++r) {
    const RankReport& report = state->ranks[r];
    const Phase phase = static_cast<Phase>(report.phase.load());
    const bool struck = std::find(victims.begin(), victims.end(), r) != victims.end();
    const std::string error = report.error;
    const int64_t errorAt = report.errorAtNs.load();
    if (settings.verbose) {
      outcome.details.push_back(format(
          "rank %d (host %d, pid %d): %s, %d of %zu ops (longest %lld ms), init %lld ms, "
          "destroy %lld ms, fds %d -> %d, threads %d -> %d%s%s",
          r, trial.hostOf[r], report.pid.load(), phaseName(phase), report.opsDone.load(),
          trial.ops.size(), static_cast<long long>(report.longestOpMs.load()),
          static_cast<long long>(report.initMs.load()),
          static_cast<long long>(report.destroyMs.load()), report.fdsBefore.load(),
          report.fdsAfter.load(), report.threadsBefore.load(), report.threadsAfter.load(),
          error.empty() ? ""
          : faultAt
              ? format(", failed %+.0f ms after the fault: ", (errorAt - faultAt) / 1e6).c_str()
              : ", failed (no fault): ",
          error.c_str()));
    }
    if (report.wrong[0]) violation(format("rank %d: a wrong result: %s", r, report.wrong));
    // The ranks the fault killed or stopped are not judged; the rank that
    // aborted is, but for naming: its own ops fail with its abort.
    if (struck && trial.fault != Fault::Abort) continue;
    if (phase != Phase::Reported) {
      if (harness.size() == 0)
        violation(format("rank %d ended without reporting (%s)", r, phaseName(phase)));
      continue;
    }
    if (report.leaked[0])
      violation(format("rank %d: left after its communicator was destroyed: %s", r, report.leaked));
    if (error.empty()) continue;
    if (faultAt == 0 || errorAt < faultAt) {
      violation(format("rank %d failed %s: %s", r,
                       faultAt == 0 ? "with no fault" : "before the fault", error.c_str()));
      continue;
    }
    if (!struck && !namesAny(error, trial.culprits(r)))
      violation(format("rank %d's error does not name rank %s: %s", r,
                       listOf(trial.culprits(r)).c_str(), error.c_str()));
    if (errorAt - faultAt > bound)
      violation(format("rank %d failed %.0f ms after the fault (the timeout is %lld ms): %s", r,
                       (errorAt - faultAt) / 1e6, static_cast<long long>(settings.timeout.count()),
                       error.c_str()));
    if (!struck) detect = std::max(detect, errorAt - faultAt);
  }

  std::vector<uint64_t> secrets;
  for (int r = 0; r < trial.nranks; ++r)
    for (uint64_t s : {state->ranks[r].warmSecret.load(), state->ranks[r].secret.load()})
      if (s && std::find(secrets.begin(), secrets.end(), s) == secrets.end()) secrets.push_back(s);
  for (uint64_t secret : secrets)
    for (const std::string& name : removeSegmentsOf(secret)) violation("left in /dev/shm: " + name);

  if (hosts) {
    hosts.reset();
    for (const std::string& name : leftoverNamespaces()) {
      violation("namespace left after the hosts were removed: " + name);
      std::system(("ip netns del " + name + " >/dev/null 2>&1").c_str());
    }
  }

  if (detect >= 0) outcome.detectMs = detect / 1'000'000;
  outcome.result = !outcome.violations.empty() ? Result::Violation
                   : detect >= 0               ? Result::FailedNamingCulprit
                                               : Result::Finished;
  if (outcome.result == Result::Violation) {
    outcome.logs = logs;
  } else {
    for (const std::string& log : logs) ::unlink(log.c_str());
  }
  outcome.seconds = std::chrono::duration<double>(steady_clock::now() - started).count();
  return outcome;
}

}  // namespace braid::chaos
