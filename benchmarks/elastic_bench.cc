// braid-bench-elastic: how soon the survivors of a killed rank go on.
// Each round forks N ranks (and one spare process), lets them run
// all-reduces, kills the last rank with SIGKILL, and times on every
// survivor, as the slowest survivor saw it:
//   detect   from the kill to the survivor's failed all-reduce
//   shrink   Communicator::shrink() (agreed: no list), from the moment the
//            last survivor called it (the others wait there for it: that
//            wait is the spread of `detect`) to the last one's return
//   1st op   the shrunk communicator's first all-reduce (with measured
//            tuning, BRAID_TUNING's default, it times the algorithms for
//            its size first: the same on any new communicator)
//   usable   from the kill to that all-reduce done: the target is 1 s
//   fresh    the way without shrink, side by side: a new communicator
//            among the same survivors (newUniqueId, init) ...
//   1st op   ... and its first all-reduce
//   grow     the spare joins the survivors (growId, grow, a first all-reduce)
// and the ratios fresh / shrink of making the communicator, and of making
// it and running its first op; each round and the medians.
//
//   braid-bench-elastic [-n RANKS] [--rounds N] [--netns PREFIX --per-host K]
//
// --netns runs rank r in network namespace PREFIXh(r / K) as its host
// (tools/netns_hosts.sh up PREFIX HOSTS makes them), over tcp between
// hosts; the spare takes the killed rank's host.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_cli.h"
#include "braid/braid.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 64;

struct Args {
  int ranks = 4;
  int rounds = 5;
  std::string netns;
  int perHost = 0;
};

// What the processes of one round share (mapped before they fork).
struct Shared {
  std::atomic<int> idReady, freshReady, growReady;
  braid::UniqueId id, freshId, growId;
  std::atomic<int64_t> killedAt;  // steady-clock ns: the same clock in every process
  struct Times {
    std::atomic<int64_t> detect, shrunkFirst, usable, fresh, freshFirst, grow;  // ns
    std::atomic<int64_t> shrinkCalled, shrinkDone;                              // steady-clock ns
  } times[kMaxRanks];
  std::atomic<int> failures;
};

int64_t now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

braid::UniqueId await(std::atomic<int>& ready, const braid::UniqueId& id) {
  while (ready.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  return id;
}

void publish(std::atomic<int>& ready, braid::UniqueId& slot, const braid::UniqueId& id) {
  slot = id;
  ready.store(1);
}

// Enters rank `rank`'s namespace host, if any.
braid::Config enterHost(const Args& args, int host) {
  braid::Config config;
  if (args.netns.empty()) return config;
  const std::string path = "/var/run/netns/" + args.netns + "h" + std::to_string(host);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "cannot enter %s (make it with tools/netns_hosts.sh up)\n", path.c_str());
    std::_Exit(2);
  }
  ::close(fd);
  config.socketIfname = "eth0";
  return config;
}

void allReduceOne(braid::Communicator& comm) {
  float x = 1.0f;
  comm.allReduce(&x, &x, 1, braid::DataType::Float32, braid::ReduceOp::Sum);
  if (x != static_cast<float>(comm.size())) throw std::runtime_error("wrong all-reduce result");
}

void survivor(Shared& shared, braid::Communicator& comm, int rank, const braid::Config& config) {
  Shared::Times& times = shared.times[rank];
  try {
    for (;;) allReduceOne(comm);
  } catch (const braid::Error&) {
    times.detect = now() - shared.killedAt.load();
  }
  times.shrinkCalled = now();
  braid::Communicator shrunk = comm.shrink();
  times.shrinkDone = now();
  allReduceOne(shrunk);
  times.shrunkFirst = now() - times.shrinkDone;
  times.usable = now() - shared.killedAt.load();

  // The way without shrink: a fresh communicator among the same ranks.
  shrunk.barrier();
  int64_t start = now();
  if (shrunk.rank() == 0)
    publish(shared.freshReady, shared.freshId, braid::Communicator::newUniqueId(config));
  {
    braid::Communicator fresh = braid::Communicator::init(
        shrunk.size(), shrunk.rank(), await(shared.freshReady, shared.freshId), config);
    times.fresh = now() - start;
    start = now();
    allReduceOne(fresh);
    times.freshFirst = now() - start;
  }

  // The spare joins.
  shrunk.barrier();
  start = now();
  braid::UniqueId id;
  if (shrunk.rank() == 0) {
    id = shrunk.growId();
    publish(shared.growReady, shared.growId, id);
  }
  braid::Communicator grown = shrunk.grow(shrunk.size() + 1, shrunk.rank() == 0 ? &id : nullptr);
  allReduceOne(grown);
  times.grow = now() - start;
}

// One round; false when a process failed.
bool round(const Args& args, Shared& shared) {
  const int n = args.ranks;
  const int victim = n - 1;
  std::vector<pid_t> pids;
  std::fflush(stdout);                     // (or each child prints it again)
  for (int rank = 0; rank <= n; ++rank) {  // rank n: the spare
    const pid_t pid = ::fork();
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    ::alarm(120);
    const int host = args.perHost > 0 ? (rank == n ? victim : rank) / args.perHost : 0;
    braid::Config config = enterHost(args, host);
    try {
      if (rank == n) {
        braid::Communicator grown =
            braid::Communicator::init(n, victim, await(shared.growReady, shared.growId), config);
        allReduceOne(grown);
        std::_Exit(0);
      }
      if (rank == 0) publish(shared.idReady, shared.id, braid::Communicator::newUniqueId(config));
      braid::Communicator comm =
          braid::Communicator::init(n, rank, await(shared.idReady, shared.id), config);
      for (int i = 0; i < 100; ++i) allReduceOne(comm);
      comm.barrier();
      if (rank == victim) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        shared.killedAt = now();
        ::raise(SIGKILL);
      }
      survivor(shared, comm, rank, config);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      shared.failures.fetch_add(1);
      std::_Exit(1);
    }
    std::fflush(stdout);
    std::_Exit(0);
  }
  bool ok = true;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    const bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (static_cast<int>(i) == victim ? !killed : !passed) ok = false;
  }
  return ok;
}

double slowest(const Shared& shared, int survivors, std::atomic<int64_t> Shared::Times::*field) {
  int64_t worst = 0;
  for (int r = 0; r < survivors; ++r) worst = std::max(worst, (shared.times[r].*field).load());
  return worst / 1e6;
}

// shrink() as the slowest survivor saw it, from the last one's call.
double shrinkTime(const Shared& shared, int survivors) {
  int64_t lastCall = 0, lastDone = 0;
  for (int r = 0; r < survivors; ++r) {
    lastCall = std::max(lastCall, shared.times[r].shrinkCalled.load());
    lastDone = std::max(lastDone, shared.times[r].shrinkDone.load());
  }
  return (lastDone - lastCall) / 1e6;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

[[noreturn]] void usage(int status) {
  std::fprintf(status ? stderr : stdout,
               "usage: braid-bench-elastic [-n RANKS] [--rounds N] [--netns PREFIX --per-host "
               "K]\n");
  std::exit(status);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage(0);
    if (i + 1 >= argc) usage(2);
    const std::string value = argv[++i];
    if (flag == "-n")
      args.ranks = static_cast<int>(braid::bench::intValue(flag, value, 3, kMaxRanks));
    else if (flag == "--rounds")
      args.rounds = static_cast<int>(braid::bench::intValue(flag, value, 1, 1000));
    else if (flag == "--netns")
      args.netns = value;
    else if (flag == "--per-host")
      args.perHost = static_cast<int>(braid::bench::intValue(flag, value, 1, kMaxRanks));
    else
      usage(2);
  }
  if (!args.netns.empty() && args.perHost == 0) usage(2);
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const braid::bench::UsageError& error) {
    std::fprintf(stderr, "braid-bench-elastic: %s\n", error.what());
    return 2;
  }
  auto* shared = static_cast<Shared*>(
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return 1;
  std::printf("# %d ranks%s, rank %d killed; ms, the slowest survivor's\n", args.ranks,
              args.netns.empty()
                  ? " on this host"
                  : (", " + std::to_string(args.perHost) + " per namespace host").c_str(),
              args.ranks - 1);
  std::printf("%6s %7s %7s %7s %7s %7s %7s %7s %12s\n", "", "", "", "", "", "", "", "",
              "fresh/shrink");
  std::printf("%6s %7s %7s %7s %7s %7s %7s %7s %6s %6s\n", "round", "detect", "shrink", "1st op",
              "usable", "fresh", "1st op", "grow", "made", "+1st");
  std::vector<double> detect, shrink, shrunkFirst, usable, fresh, freshFirst, grow;
  auto line = [&](const char* label, double d, double s, double s1, double u, double f, double f1,
                  double g) {
    std::printf("%6s %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %5.1fx %5.1fx\n", label, d, s, s1, u,
                f, f1, g, f / s, (f + f1) / (s + s1));
    std::fflush(stdout);
  };
  const int survivors = args.ranks - 1;
  for (int r = 0; r < args.rounds; ++r) {
    new (shared) Shared{};
    if (!round(args, *shared)) {
      std::fprintf(stderr, "round %d failed\n", r);
      return 1;
    }
    detect.push_back(slowest(*shared, survivors, &Shared::Times::detect));
    shrink.push_back(shrinkTime(*shared, survivors));
    shrunkFirst.push_back(slowest(*shared, survivors, &Shared::Times::shrunkFirst));
    usable.push_back(slowest(*shared, survivors, &Shared::Times::usable));
    fresh.push_back(slowest(*shared, survivors, &Shared::Times::fresh));
    freshFirst.push_back(slowest(*shared, survivors, &Shared::Times::freshFirst));
    grow.push_back(slowest(*shared, survivors, &Shared::Times::grow));
    line(std::to_string(r).c_str(), detect.back(), shrink.back(), shrunkFirst.back(), usable.back(),
         fresh.back(), freshFirst.back(), grow.back());
  }
  line("median", median(detect), median(shrink), median(shrunkFirst), median(usable), median(fresh),
       median(freshFirst), median(grow));
  return 0;
}
