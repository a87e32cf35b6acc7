#include "core/calibrate.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "core/log.h"
#include "reduce/reduce.h"
#include "tuning/calibration.h"

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSmallBytes = 8;
constexpr size_t kLargeBytes = 256 * 1024;
constexpr size_t kMiddleBytes = 64 * 1024;
// The token makes about kTokenHops hops in all (at least 2 rounds), so that
// creation stays quick at thousands of ranks.
constexpr int kTokenHops = 400, kLargeRounds = 12, kLocalRounds = 5;
// Rounds of each step timed for pieces by address, and of the middle size.
constexpr int kAddressRounds = 6;
// Tags no op uses: ops carry their sequence number in the low bits, and
// calibration runs before the first op, but a distinct tag makes a stray
// message fail loudly rather than pass as an op's.
constexpr uint32_t kTag = 0x7ca1b000u;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A token passed `rounds` times around the ring: rank 0 sends first, every
// other rank passes on what it received. Only one rank is busy at a time,
// so a round takes n message latencies, wake-ups included.
algo::Plan tokenPlan(int rank, int nranks, int rounds) {
  algo::Plan plan;
  algo::Step send;
  send.kind = algo::StepKind::Send;
  send.sendPeer = (rank + 1) % nranks;
  send.src = algo::Buffer::Input;
  send.count = kSmallBytes;
  algo::Step recv;
  recv.kind = algo::StepKind::Recv;
  recv.recvPeer = (rank + nranks - 1) % nranks;
  recv.dst = algo::Buffer::Output;
  recv.count = kSmallBytes;
  for (int i = 0; i < rounds; ++i) {
    plan.steps.push_back(rank == 0 ? send : recv);
    plan.steps.push_back(rank == 0 ? recv : send);
  }
  return plan;
}

// `rounds` ring exchanges of `bytes`: every rank sends to the next and
// receives from the previous one, all at once, as a ring step does.
algo::Plan ringPlan(int rank, int nranks, size_t bytes, int rounds) {
  algo::Plan plan = tokenPlan(0, nranks, rounds);
  for (algo::Step& step : plan.steps) {
    step.sendPeer = step.kind == algo::StepKind::Send ? (rank + 1) % nranks : -1;
    step.recvPeer = step.kind == algo::StepKind::Recv ? (rank + nranks - 1) % nranks : -1;
    step.count = bytes;
  }
  return plan;
}

}  // namespace

algo::LinkModel calibrateLink(exec::Executor& executor, bootstrap::Bootstrap& bootstrap,
                              const transport::Wiring& wiring, std::chrono::milliseconds timeout,
                              const std::atomic<bool>& aborted, const algo::LinkModel& fallback,
                              size_t* addressFrom) {
  const int rank = bootstrap.rank(), nranks = bootstrap.size();
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  std::vector<std::byte> a(kLargeBytes), b(kLargeBytes);
  std::memset(a.data(), 0x3f, a.size());  // floats near 0.75: no denormals in the sum
  std::memset(b.data(), 0x3f, b.size());

  std::vector<tuning::Probe> probes(static_cast<size_t>(nranks));
  tuning::Probe& mine = probes[static_cast<size_t>(rank)];
  if (nranks > 1) {
    exec::OpInfo info;
    info.name = "calibration";
    auto time = [&](const algo::Plan& plan) {
      exec::Lane lane;
      lane.plan = &plan;
      lane.input = a.data();
      lane.output = b.data();
      lane.tag = kTag;
      lane.info = &info;
      lane.nranks = nranks;
      lane.inputSettled = true;  // (a, which nothing writes: its pieces may go by address)
      const Clock::time_point start = Clock::now();
      executor.run(&lane, 1, timeout, aborted);
      return seconds(Clock::now() - start);
    };
    const int rounds = std::max(2, kTokenHops / nranks);
    time(tokenPlan(rank, nranks, std::max(1, rounds / 10)));  // warm up, meet the neighbours
    mine.smallSeconds = time(tokenPlan(rank, nranks, rounds)) / (rounds * nranks);
    time(ringPlan(rank, nranks, kLargeBytes, 10));
    mine.largeSeconds = time(ringPlan(rank, nranks, kLargeBytes, kLargeRounds)) / kLargeRounds;
    mine.largeBytes = static_cast<double>(kLargeBytes);
    if (addressFrom) {
      // The same steps with every piece by address, and both ways at a
      // middle size, each after a round that warms its path.
      auto step = [&](size_t bytes) {
        time(ringPlan(rank, nranks, bytes, 2));
        return time(ringPlan(rank, nranks, bytes, kAddressRounds)) / kAddressRounds;
      };
      executor.sendByAddressFrom(1);
      mine.largeAddressSeconds = step(kLargeBytes);
      mine.middleAddressSeconds = step(kMiddleBytes);
      executor.sendByAddressFrom(0);
      mine.middleSeconds = step(kMiddleBytes);
      mine.middleBytes = static_cast<double>(kMiddleBytes);
    }
    mine.memoryLink =
        wiring.entries[static_cast<size_t>(next)]->reach == transport::Reach::SameHost &&
        wiring.entries[static_cast<size_t>(prev)]->reach == transport::Reach::SameHost;

    // Local speeds, best of a few rounds (the first also warms the pages).
    double copy = 0, sum = 0;
    const reduce::Kernel kernel = reduce::kernelFor(DataType::Float32, ReduceOp::Sum);
    for (int i = 0; i < kLocalRounds; ++i) {
      Clock::time_point start = Clock::now();
      std::memcpy(b.data(), a.data(), kLargeBytes);
      const double copied = seconds(Clock::now() - start);
      start = Clock::now();
      kernel(b.data(), b.data(), a.data(), kLargeBytes / sizeof(float));
      const double summed = seconds(Clock::now() - start);
      copy = i == 0 ? copied : std::min(copy, copied);
      sum = i == 0 ? summed : std::min(sum, summed);
    }
    mine.copyRate = copy > 0 ? kLargeBytes / copy : 0;
    mine.reduceRate = sum > 0 ? kLargeBytes / sum : 0;
  }
  bootstrap.allGather(probes.data(), sizeof(tuning::Probe), Clock::now() + timeout);
  if (addressFrom) {
    const double largeBySlots = mine.largeSeconds;  // (the crossover may replace it)
    *addressFrom = tuning::addressCrossover(&probes);
    executor.sendByAddressFrom(*addressFrom);
    BRAID_INFO(Init,
               "calibration: pieces by address %s (here: %.0f KiB step %.3g us by address, %.3g "
               "us through slots; %.0f KiB %.3g us, %.3g us)",
               *addressFrom ? format("from %zu KiB", *addressFrom / 1024).c_str() : "never",
               kMiddleBytes / 1024.0, mine.middleAddressSeconds * 1e6, mine.middleSeconds * 1e6,
               kLargeBytes / 1024.0, mine.largeAddressSeconds * 1e6, largeBySlots * 1e6);
  }
  const algo::LinkModel link = tuning::fitLink(probes, fallback);
  BRAID_INFO(Init,
             "calibration: hop %.3g us, %.0f KiB ring step %.3g us, copy %.3g GB/s, sum %.3g "
             "GB/s here; model: latency %.3g us, link %.3g GB/s, copy %.3g GB/s, sum %.3g GB/s",
             mine.smallSeconds * 1e6, kLargeBytes / 1024.0, mine.largeSeconds * 1e6,
             mine.copyRate / 1e9, mine.reduceRate / 1e9, link.latency * 1e6, link.bandwidth / 1e9,
             link.copyBandwidth / 1e9, link.reduceBandwidth / 1e9);
  return link;
}

}  // namespace braid
