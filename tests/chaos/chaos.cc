// braid_chaos: a seeded chaos campaign. Each trial, drawn from its seed
// (trial.h), forks 2 to 6 ranks on one host or on 2 to 3 network-namespace
// hosts, over one transport, runs a random schedule of checked collectives,
// send/recvs and groups, and injects one fault at a random moment after
// the ranks' first barrier (kill, stop, abort of a rank; a link down, a
// silent partition or a host torn down). Ranks done with their schedule
// before the fault mostly wait for it and end with a barrier, so that the
// fault meets an op. What must hold (run_trial.cc judges it): every rank
// the fault did not strike finishes every op with the right results or
// fails with a braid::Error naming the rank at fault within the timeout
// plus 2 s; nothing hangs, no result is wrong, no survivor dies of a
// signal; and once the communicators are destroyed, nothing of the job is
// left in /dev/shm, no fd or thread in a surviving rank (counted against a
// first communicator each rank made and destroyed before: rank.cc), no
// namespace.
//
//   braid_chaos --seed S              one trial (a replay)
//   braid_chaos --seeds A-B           trials A to B
//   braid_chaos --trials N [--first S]  N trials from seed S (default 1)
//   --transport NAME, --fault KIND    restrict the draws
//   --cover                           seed S takes the S-th transport x fault pair of a walk
//                                     over every pair, instead of drawing them
//   --one-host                        no namespace hosts (as where they cannot be made)
//   --verbose                         each rank's report and the schedule
//
// Prints one line per trial, then a table per transport and fault; exits 0
// only when no trial violated anything.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "chaos/rank.h"
#include "chaos/run_trial.h"
#include "chaos/trial.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "core/knobs.h"
#include "device_support.h"
#include "netns_hosts.h"

extern char** environ;

namespace braid::chaos {
namespace {

struct Arguments {
  std::vector<uint64_t> seeds;
  std::optional<Transport> transport;
  std::optional<Fault> fault;
  bool cover = false;
  bool oneHost = false;
  bool verbose = false;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "braid_chaos: %s\n"
               "usage: braid_chaos (--seed S | --seeds A-B | --trials N [--first S])\n"
               "                   [--transport NAME] [--fault KIND] [--cover] [--one-host]\n"
               "                   [--verbose]\n"
               "  transports: shm tcp tcp4 ucx ibverbs device staged\n"
               "  faults: none kill stop abort linkdown partition torndown\n",
               problem.c_str());
  std::exit(2);
}

uint64_t number(const std::string& text, const char* what) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') usage(std::string("not a number for ") + what + ": " + text);
  return value;
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  std::optional<uint64_t> trials, first;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--seed") {
      args.seeds.push_back(number(value(), "--seed"));
    } else if (arg == "--seeds") {
      const std::string range = value();
      const size_t dash = range.find('-');
      if (dash == std::string::npos) usage("--seeds takes A-B");
      const uint64_t a = number(range.substr(0, dash), "--seeds");
      const uint64_t b = number(range.substr(dash + 1), "--seeds");
      if (b < a) usage("--seeds A-B needs A <= B");
      for (uint64_t s = a; s <= b; ++s) args.seeds.push_back(s);
    } else if (arg == "--trials") {
      trials = number(value(), "--trials");
    } else if (arg == "--first") {
      first = number(value(), "--first");
    } else if (arg == "--transport") {
      const std::string name = value();
      args.transport = parseTransport(name);
      if (!args.transport) usage("no transport named " + name);
    } else if (arg == "--fault") {
      const std::string name = value();
      args.fault = parseFault(name);
      if (!args.fault) usage("no fault named " + name);
    } else if (arg == "--cover") {
      args.cover = true;
    } else if (arg == "--one-host") {
      args.oneHost = true;
    } else if (arg == "--verbose") {
      args.verbose = true;
    } else {
      usage("unknown argument " + arg);
    }
  }
  if (trials)
    for (uint64_t s = 0; s < *trials; ++s) args.seeds.push_back(first.value_or(1) + s);
  if (args.seeds.empty()) usage("no trial to run");
  return args;
}

// What this machine and build offer, said on stdout.
Offer probe(const Arguments& args) {
  Offer offer;
  offer.onlyTransport = args.transport;
  offer.onlyFault = args.fault;
  std::map<Transport, std::string> why;
  why[Transport::Ucx] = braid::testing::askInChild([] { return detail::transportStatus("ucx"); });
  why[Transport::Ibverbs] = braid::testing::askInChild([] {
    ::setenv("BRAID_IB_FAKE", "chaos", 1);
    return detail::transportStatus("ibverbs");
  });
  why[Transport::Device] = testing::unavailable("emulated");
  why[Transport::Staged] = why[Transport::Device];
  std::string offered, missing;
  for (int t = 0; t < kNumTransports; ++t) {
    const Transport transport = static_cast<Transport>(t);
    if (why[transport].empty()) {
      offer.transports.push_back(transport);
      offered += std::string(" ") + transportName(transport);
    } else {
      missing += format("; %s: %s", transportName(transport), why[transport].c_str());
    }
  }
  std::string whyNot = "--one-host";
  if (!args.oneHost) {
    testing::NamespaceHosts hosts(2);
    offer.namespaces = hosts.ready();
    whyNot = hosts.why();
  }
  std::printf("braid_chaos: transports here:%s%s\n", offered.c_str(), missing.c_str());
  std::printf("braid_chaos: network namespaces: %s\n",
              offer.namespaces ? "yes"
                               : ("no (" + whyNot +
                                  "): multi-host draws run on one host, network faults "
                                  "become faults of a rank")
                                     .c_str());
  return offer;
}

// The knobs (braid's, by their names and NCCL aliases; UCX's) set in the
// driver's own environment, which every rank inherits: "" or
// "NAME=value ... ".
std::string inheritedEnvironment() {
  std::string text;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool knob = name.rfind("UCX_", 0) == 0;
    for (const KnobInfo& info : knobTable())
      knob = knob || name == info.name || (info.alias && name == info.alias);
    if (knob) text += entry + " ";
  }
  return text;
}

struct Cell {
  int trials = 0, finished = 0, named = 0, violations = 0;
  std::vector<int64_t> detects;
};

std::string victimOf(const Trial& trial) {
  if (trial.victim >= 0) return std::to_string(trial.victim);
  if (trial.victimHost >= 0) return "host " + std::to_string(trial.victimHost);
  return "-";
}

void printTable(const std::map<std::pair<int, int>, Cell>& cells) {
  std::printf("\n%-9s %-10s %6s %8s %13s %13s %10s %10s\n", "transport", "fault", "trials",
              "finished", "failed-naming", "detect median", "detect max", "violations");
  Cell total;
  for (const auto& [key, cell] : cells) {
    std::vector<int64_t> d = cell.detects;
    std::sort(d.begin(), d.end());
    const std::string median = d.empty() ? "-" : format("%lld ms", (long long)d[d.size() / 2]);
    const std::string max = d.empty() ? "-" : format("%lld ms", (long long)d.back());
    std::printf("%-9s %-10s %6d %8d %13d %13s %10s %10d\n",
                transportName(static_cast<Transport>(key.first)),
                faultName(static_cast<Fault>(key.second)), cell.trials, cell.finished, cell.named,
                median.c_str(), max.c_str(), cell.violations);
    total.trials += cell.trials;
    total.finished += cell.finished;
    total.named += cell.named;
    total.violations += cell.violations;
    total.detects.insert(total.detects.end(), d.begin(), d.end());
  }
  std::sort(total.detects.begin(), total.detects.end());
  const auto& d = total.detects;
  std::printf("%-9s %-10s %6d %8d %13d %13s %10s %10d\n", "all", "", total.trials, total.finished,
              total.named, d.empty() ? "-" : format("%lld ms", (long long)d[d.size() / 2]).c_str(),
              d.empty() ? "-" : format("%lld ms", (long long)d.back()).c_str(), total.violations);
}

int run(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  const Offer offer = probe(args);
  char dir[] = "/tmp/braid-chaos-XXXXXX";
  if (!::mkdtemp(dir)) usage("cannot make a folder for the ranks' logs in /tmp");
  RunSettings settings;
  settings.logDir = dir;
  settings.verbose = args.verbose;
  const std::string inherited = inheritedEnvironment();

  std::map<std::pair<int, int>, Cell> cells;
  int violating = 0, downgraded = 0, missed = 0;
  std::printf("%-20s %5s %5s %-9s %-10s %-7s %7s  %-22s %9s %7s\n", "seed", "ranks", "hosts",
              "transport", "fault", "victim", "moment", "outcome", "detection", "time");
  for (size_t i = 0; i < args.seeds.size(); ++i) {
    const uint64_t seed = args.seeds[i];
    Trial trial;
    try {
      trial = drawTrial(seed, offer, args.cover);
    } catch (const std::exception& error) {
      usage(error.what());
    }
    downgraded += trial.downgraded;
    if (args.verbose) {
      std::string hostOf;
      for (int h : trial.hostOf) hostOf += " " + std::to_string(h);
      std::printf("seed %llu: hosts of the ranks:%s; %s%s\n", (unsigned long long)seed,
                  hostOf.c_str(), trial.linger ? "ranks done early wait for the fault; " : "",
                  transportEnvironment(trial).c_str());
      for (size_t k = 0; k < trial.ops.size(); ++k)
        std::printf("  op #%zu %s\n", k, describe(trial.ops[k]).c_str());
      std::fflush(stdout);
    }
    const Outcome outcome = runTrial(trial, settings);
    missed += outcome.faultMissed;
    const std::string detection =
        outcome.detectMs ? format("%lld ms", (long long)*outcome.detectMs) : "-";
    std::printf("%-20llu %5d %5d %-9s %-10s %-7s %4lld ms  %-22s %9s %6.1fs\n",
                (unsigned long long)seed, trial.nranks, trial.hosts, transportName(trial.transport),
                faultName(trial.fault), victimOf(trial).c_str(), (long long)trial.moment.count(),
                resultName(outcome.result), detection.c_str(), outcome.seconds);
    for (const std::string& line : outcome.details) std::printf("  %s\n", line.c_str());
    Cell& cell = cells[{static_cast<int>(trial.transport), static_cast<int>(trial.fault)}];
    ++cell.trials;
    if (outcome.result == Result::Violation) {
      ++cell.violations;
      ++violating;
      for (const std::string& why : outcome.violations)
        std::printf("  violation: %s\n", why.c_str());
      // The flags that make the same draw.
      std::string flags;
      if (args.cover) flags += " --cover";
      if (args.transport) flags += std::string(" --transport ") + transportName(*args.transport);
      if (args.fault) flags += std::string(" --fault ") + faultName(*args.fault);
      if (!offer.namespaces) flags += " --one-host";
      std::printf("  replay: %sbraid_chaos --seed %llu%s\n", inherited.c_str(),
                  (unsigned long long)seed, flags.c_str());
      const std::string env = transportEnvironment(trial);
      std::printf("  the ranks ran with: %s (Config::timeout %lld ms)\n",
                  env.empty() ? "braid's defaults" : env.c_str(),
                  (long long)settings.timeout.count());
      for (const std::string& log : outcome.logs)
        if (::access(log.c_str(), R_OK) == 0) std::printf("  rank log: %s\n", log.c_str());
    } else if (outcome.result == Result::FailedNamingCulprit) {
      ++cell.named;
      cell.detects.push_back(*outcome.detectMs);
    } else {
      ++cell.finished;
    }
    std::fflush(stdout);
  }
  printTable(cells);
  std::printf("\n%zu trials, %d with violations", args.seeds.size(), violating);
  if (missed) std::printf("; %d faults came after every rank was done", missed);
  if (downgraded)
    std::printf("; %d multi-host draws ran on one host (no network namespaces here)", downgraded);
  std::printf("\n");
  ::rmdir(dir);  // only where no violation left logs in it
  return violating == 0 ? 0 : 1;
}

}  // namespace
}  // namespace braid::chaos

int main(int argc, char** argv) { return braid::chaos::run(argc, argv); }
