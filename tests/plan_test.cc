// Every planner in the plan simulator (algorithms/simulate.h), without
// processes: every receive matched by a send of the same size, no deadlock
// and no message left over, settled marks true, and every rank ending with
// the collective's exact integer result, at every rank count from 1 to 64
// and at 127, 128, 255, 256, 1000 and 1024 ranks; the hierarchical ones
// also at layouts of several ranks per host, up to 1026 ranks.
#include "algorithms/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/catalog.h"
#include "algorithms/simulate.h"
#include "core/plan_cache.h"
#include "tuning/algo_choice.h"
#include "tuning/calibration.h"
#include "tuning/copy_choice.h"

namespace braid::algo {
namespace {

constexpr Collective kCollectives[] = {Collective::AllReduce, Collective::Broadcast,
                                       Collective::Reduce, Collective::AllGather,
                                       Collective::ReduceScatter};

bool gathered(Collective c) { return c == Collective::AllGather || c == Collective::ReduceScatter; }

// Every algorithm of every collective on n ranks, over `counts` (per rank for
// the gathered collectives, which get `gatheredCounts`), from two roots.
void checkAll(int n, const std::vector<size_t>& counts, const std::vector<size_t>& gatheredCounts,
              size_t chunkBytes, bool mapped = false) {
  SimOptions options;
  options.elemSize = 8;
  options.chunkBytes = chunkBytes;
  options.mapped = mapped;
  for (Collective c : kCollectives)
    for (Algorithm a : algorithmsFor(c))
      for (size_t count : gathered(c) ? gatheredCounts : counts)
        for (int root : {0, n - 1}) {
          if (root != 0 && c != Collective::Broadcast && c != Collective::Reduce) continue;
          Shape shape;
          shape.nranks = n;
          shape.count = count;
          shape.elemSize = options.elemSize;
          shape.mapped = mapped;
          if (!applies(c, a, shape)) continue;
          // The one-shot plan has every rank's input in flight to every
          // rank at once: n^2 * count elements, kept small at large n.
          if (a == Algorithm::OneShot && n > 64 && count > 40) continue;
          SimResult result = simulate(c, a, n, count, root, options);
          ASSERT_EQ(result.problem, "")
              << collectiveName(c) << " " << algorithmName(a) << " at " << n << " ranks, count "
              << count << ", root " << root << ", chunk " << chunkBytes << " bytes"
              << (mapped ? ", mapped" : "");
        }
}

// The catalog drives the names and the lists: every row's name parses back
// to its algorithm, and algorithmsFor gives a collective's rows in order.
TEST(Plans, CatalogNamesParseBackAndAlgorithmsForFollowTheRows) {
  std::vector<std::vector<Algorithm>> rows(7);
  for (const AlgorithmInfo& row : catalog()) {
    Algorithm parsed;
    ASSERT_TRUE(parseAlgorithm(row.name, &parsed)) << row.name;
    EXPECT_EQ(parsed, row.algorithm) << row.name;
    EXPECT_STREQ(algorithmName(row.algorithm), row.name);
    EXPECT_NE(std::string(row.description), "") << row.name;
    rows[static_cast<size_t>(row.collective)].push_back(row.algorithm);
  }
  for (size_t c = 0; c < rows.size(); ++c)
    EXPECT_EQ(algorithmsFor(static_cast<Collective>(c)), rows[c]) << c;
  Algorithm parsed;
  EXPECT_FALSE(parseAlgorithm("Ring", &parsed));  // exact spelling; BRAID_ALGO lowers case
}

TEST(Plans, EveryAlgorithmIsExactAtEveryRankCountFrom1To64) {
  for (int n = 1; n <= 64; ++n) {
    // Counts below, at and above the rank count; chunks of 8 elements make
    // the planners pipeline even these small buffers.
    checkAll(n, {0, 1, 5, static_cast<size_t>(n) + 3, 1000}, {0, 1, 3, 17}, 16);
    checkAll(n, {static_cast<size_t>(3 * n + 1), 1000}, {2, 9}, 1 << 20);
  }
}

// Mapped buffers: the direct plans (one-shot and two-shot all-reduce,
// one-shot all-gather and broadcast) up to kMaxDirectRanks, and whatever
// the others fall back to above it.
TEST(Plans, EveryAlgorithmIsExactOnMappedBuffers) {
  for (int n = 1; n <= 12; ++n) {
    checkAll(n, {0, 1, 5, static_cast<size_t>(n) + 3, 1000}, {0, 1, 3, 17}, 16, true);
    checkAll(n, {static_cast<size_t>(3 * n + 1)}, {2}, 1 << 20, true);
  }
  for (int n : {127, 1000}) checkAll(n, {0, 3, 40}, {0, 2}, 1 << 12, true);
}

// The direct plans (those the catalog gives for mapped buffers that have
// direct steps) read and write peers' buffers only between Signals (a
// rank's local steps may come before), and a rank's Signals to and from
// every peer come in rounds.
TEST(Plans, DirectStepsSitBetweenRoundsOfSignals) {
  int directPlans = 0;
  for (int n : {2, 3, 5, 8})
    for (const AlgorithmInfo& row : catalog())
      for (int r = 0; r < n; ++r) {
        const Algorithm a = row.algorithm;
        Shape shape;
        shape.nranks = n;
        shape.rank = r;
        shape.count = 1000;
        shape.elemSize = 4;
        shape.mapped = true;
        if (!applies(row.collective, a, shape)) continue;
        const Plan plan = makePlan(row.collective, a, shape);
        if (!plan.mapped) continue;
        ++directPlans;
        int rounds = 0;
        bool directSinceRound = false;
        for (size_t i = 0; i < plan.steps.size();) {
          if (plan.steps[i].kind != StepKind::Signal) {
            ASSERT_TRUE(rounds > 0 || !direct(plan.steps[i].kind))
                << algorithmName(a) << ": a direct step before the first Signal";
            directSinceRound |= direct(plan.steps[i].kind);
            ++i;
            continue;
          }
          std::vector<int> to, from;  // one round: n - 1 Signals
          for (; i < plan.steps.size() && plan.steps[i].kind == StepKind::Signal &&
                 to.size() < static_cast<size_t>(n - 1);
               ++i) {
            to.push_back(plan.steps[i].sendPeer);
            from.push_back(plan.steps[i].recvPeer);
          }
          std::sort(to.begin(), to.end());
          std::sort(from.begin(), from.end());
          ASSERT_EQ(to, from) << algorithmName(a) << " rank " << r << ": a round misses a peer";
          ASSERT_EQ(to.size(), static_cast<size_t>(n - 1));
          ++rounds;
          directSinceRound = false;
        }
        EXPECT_FALSE(directSinceRound)
            << algorithmName(a) << ": a direct step after the last Signal";
        EXPECT_GE(rounds, 2);
      }
  EXPECT_GT(directPlans, 0);
}

TEST(Plans, EveryAlgorithmIsExactAtHundredsAndThousandsOfRanks) {
  for (int n : {127, 128, 255, 256, 1000, 1024}) checkAll(n, {0, 3, 40, 2000}, {0, 1, 2}, 1 << 12);
}

// The hierarchical algorithms, at L ranks on each of H hosts: small
// layouts with pipelining chunks and whole-buffer chunks, and more than a
// thousand ranks with several per host.
void checkHierarchical(int L, int H, const std::vector<size_t>& counts,
                       const std::vector<size_t>& gatheredCounts, size_t chunkBytes) {
  const int n = L * H;
  SimOptions options;
  options.elemSize = 8;
  options.chunkBytes = chunkBytes;
  options.localRanks = L;
  for (Collective c : kCollectives) {
    Shape shape;
    shape.nranks = n;
    shape.localRanks = L;
    if (!applies(c, Algorithm::Hierarchical, shape)) continue;
    for (size_t count : gathered(c) ? gatheredCounts : counts)
      for (int root : {0, n - 1, L + 1}) {
        if (root != 0 && c != Collective::Broadcast) continue;
        SimResult result = simulate(c, Algorithm::Hierarchical, n, count, root % n, options);
        ASSERT_EQ(result.problem, "")
            << collectiveName(c) << " hier at " << H << " hosts of " << L << " ranks, count "
            << count << ", root " << root % n << ", chunk " << chunkBytes << " bytes";
      }
  }
}

TEST(Plans, HierarchicalAlgorithmsAreExactAtEveryLayoutUpTo8HostsOf6Ranks) {
  for (int L = 2; L <= 6; ++L)
    for (int H = 2; H <= 8; ++H) {
      const size_t n = static_cast<size_t>(L * H);
      checkHierarchical(L, H, {0, 1, 5, n + 3, 1000}, {0, 1, 3, 17}, 16);
      checkHierarchical(L, H, {3 * n + 1, 1000}, {2, 9}, 1 << 20);
    }
}

TEST(Plans, HierarchicalAlgorithmsAreExactAtMoreThanAThousandRanks) {
  for (auto [L, H] : {std::pair{4, 250}, std::pair{8, 128}, std::pair{3, 342}})
    checkHierarchical(L, H, {0, 3, 40, 5000}, {0, 1, 2}, 1 << 12);
}

// They apply only where the layout says several ranks on several hosts.
TEST(Plans, HierarchicalAlgorithmsNeedSeveralRanksOnSeveralHosts) {
  Shape shape;
  shape.nranks = 8;
  for (int L : {0, 1, 3, 8}) {  // unknown, one per host, uneven hosts, one host
    shape.localRanks = L;
    EXPECT_FALSE(applies(Collective::AllReduce, Algorithm::Hierarchical, shape)) << L;
  }
  shape.localRanks = 4;
  EXPECT_TRUE(applies(Collective::AllReduce, Algorithm::Hierarchical, shape));
  EXPECT_FALSE(applies(Collective::Reduce, Algorithm::Hierarchical, shape));
  shape.mapped = true;
  EXPECT_FALSE(applies(Collective::AllReduce, Algorithm::Hierarchical, shape));
}

// What crosses hosts: the hierarchical all-reduce sends 2(H-1)/H * S/L
// bytes per rank to other hosts, all-gather (H-1) * S; the flat ring's
// ranks at a host's edge send 2(n-1)/n * S and (n-1) * S.
TEST(Plans, HierarchicalAlgorithmsSendAnLthOfTheRingsBytesAcrossHosts) {
  for (auto [L, H] : {std::pair{2, 2}, std::pair{4, 3}, std::pair{3, 5}}) {
    const int n = L * H;
    const size_t count = 61440;  // a multiple of 16 * L * H for each layout: even parts
    auto acrossHostsBytes = [&](Collective c, Algorithm a, int r) {
      Shape shape;
      shape.nranks = n;
      shape.rank = r;
      shape.count = count;
      shape.elemSize = 4;
      shape.chunkElems = count;
      shape.alignElems = 16;
      shape.localRanks = L;
      size_t bytes = 0;
      for (const Step& s : makePlan(c, a, shape).steps)
        if (sends(s.kind) && s.sendPeer / L != r / L) bytes += s.count * shape.elemSize;
      return bytes;
    };
    const size_t S = count * 4;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(acrossHostsBytes(Collective::AllReduce, Algorithm::Hierarchical, r),
                2 * (H - 1) * S / H / L);
      EXPECT_EQ(acrossHostsBytes(Collective::AllGather, Algorithm::Hierarchical, r), (H - 1) * S);
      EXPECT_EQ(acrossHostsBytes(Collective::ReduceScatter, Algorithm::Hierarchical, r),
                (H - 1) * S);
    }
    EXPECT_EQ(acrossHostsBytes(Collective::AllReduce, Algorithm::Ring, L - 1), 2 * (n - 1) * S / n);
    EXPECT_EQ(acrossHostsBytes(Collective::AllGather, Algorithm::Ring, L - 1), (n - 1) * S);
  }
}

// With shm within hosts and tcp across, the model picks the hierarchical
// all-reduce for large buffers on 2 hosts of 2 ranks, and the fixed choice
// does wherever it applies; on one host neither does.
TEST(Tuning, RanksOnSeveralHostsGetTheHierarchicalAlgorithms) {
  LinkModel link;  // tcp's order of magnitude across, shm's within
  link.latency = 15e-6;
  link.bandwidth = 3e9;
  link.hostLatency = 0.15e-6;
  link.hostBandwidth = 12e9;
  link.copyBandwidth = 12e9;
  link.reduceBandwidth = 10e9;
  Shape shape;
  shape.nranks = 4;
  shape.localRanks = 2;
  shape.count = (size_t{16} << 20) / 4;
  shape.elemSize = 4;
  shape.chunkElems = (1 << 20) / 4;
  shape.alignElems = 16;
  for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter})
    EXPECT_EQ(tuning::choose(c, shape, {}, 4096, &link), Algorithm::Hierarchical)
        << collectiveName(c);
  for (Collective c : {Collective::AllReduce, Collective::Broadcast, Collective::AllGather,
                       Collective::ReduceScatter})
    EXPECT_EQ(tuning::choose(c, shape, {}, 4096), Algorithm::Hierarchical) << collectiveName(c);
  shape.localRanks = 4;
  for (Collective c : kCollectives) {
    EXPECT_NE(tuning::choose(c, shape, {}, 4096, &link), Algorithm::Hierarchical);
    EXPECT_NE(tuning::choose(c, shape, {}, 4096), Algorithm::Hierarchical);
  }
}

TEST(Plans, RingAllReduceSendsTwiceTheBufferTimesNMinusOneOverN) {
  for (int n : {2, 3, 5, 8}) {
    const size_t count = 1024 * n;
    SimOptions options;
    options.elemSize = 4;
    SimResult result = simulate(Collective::AllReduce, Algorithm::Ring, n, count, 0, options);
    ASSERT_EQ(result.problem, "");
    EXPECT_EQ(result.bytes,
              static_cast<uint64_t>(2 * (n - 1) * count * 4));  // n ranks * 2(n-1)/n S
  }
}

TEST(Plans, NoStepMovesMoreThanOneChunk) {
  for (size_t chunk : {size_t{16}, size_t{1024}})
    for (Collective c : kCollectives)
      for (Algorithm a : algorithmsFor(c)) {
        Shape shape;
        shape.nranks = 8;
        shape.rank = 3;
        shape.count = 100000;
        shape.elemSize = 4;
        shape.chunkElems = chunk;
        shape.alignElems = 16;
        shape.localRanks = 4;
        if (!applies(c, a, shape)) continue;
        for (const Step& s : makePlan(c, a, shape).steps)
          if (s.kind != StepKind::Copy) {
            ASSERT_LE(s.count, chunk) << collectiveName(c) << " " << algorithmName(a);
          }
      }
}

// The time model: at small sizes tree-shaped algorithms grow with log n and
// the ring with n; at large sizes the ring's busbw approaches the link's.
TEST(Plans, TreeLatencyGrowsLikeLogNAndRingLikeN) {
  SimOptions options;
  options.checkData = false;
  options.link.latency = 5e-6;
  options.link.bandwidth = 50e9;
  auto seconds = [&](Algorithm a, int n, size_t count) {
    SimResult result = simulate(Collective::AllReduce, a, n, count, 0, options);
    EXPECT_EQ(result.problem, "");
    return result.seconds;
  };
  // 8 bytes at 64 and 1024 ranks: the ring takes ~16x longer, the tree and
  // recursive doubling well under 3x.
  EXPECT_GT(seconds(Algorithm::Ring, 1024, 2) / seconds(Algorithm::Ring, 64, 2), 10);
  EXPECT_LT(seconds(Algorithm::Tree, 1024, 2) / seconds(Algorithm::Tree, 64, 2), 3);
  EXPECT_LT(
      seconds(Algorithm::RecursiveDoubling, 1024, 2) / seconds(Algorithm::RecursiveDoubling, 64, 2),
      3);
  // 1 GiB of floats at 16 ranks in 4 MiB chunks: ring busbw within 10% of
  // the link's.
  options.chunkBytes = size_t{4} << 20;
  const size_t count = size_t{1} << 28;
  const double t = seconds(Algorithm::Ring, 16, count);
  const double busbw = count * 4.0 / t * 2 * 15 / 16;
  EXPECT_GT(busbw, 0.9 * options.link.bandwidth);
}

// Local copies cost what the step copies: a ring exchange's receiver pays
// copyBandwidth for each byte it copies out; a copy-free model does not.
TEST(Plans, ReceivedBytesCostTheCopyBandwidth) {
  SimOptions options;
  options.checkData = false;
  options.link.latency = 1e-6;
  options.link.bandwidth = 10e9;
  const size_t count = 1 << 20;  // 4 MiB of floats, all-gathered by 4 ranks
  const double free =
      simulate(Collective::AllGather, Algorithm::Ring, 4, count, 0, options).seconds;
  options.link.copyBandwidth = 10e9;
  const double copied =
      simulate(Collective::AllGather, Algorithm::Ring, 4, count, 0, options).seconds;
  // Each rank puts 3 blocks on its link; it also copies its own block into
  // place and each of the 3 it receives out: 4 copies more, ~2.3x.
  EXPECT_GT(copied / free, 2.0);
  EXPECT_LT(copied / free, 2.6);
}

// The plan cache hands a repeated shape the plan it made for it, and a
// shape that differs in any one field of its key a plan of its own; the
// shape it had before is found again after each.
TEST(Plans, TheCacheTellsShapesApartByEveryFieldOfTheirKey) {
  PlanCache cache(4096, tuning::AlgoPreference{});
  Shape base;
  base.nranks = 4;
  base.rank = 1;
  base.count = 1000;
  base.chunkElems = 256;
  base.elemSize = 4;
  const std::shared_ptr<const Plan> first = cache.get(Collective::AllReduce, base);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(cache.get(Collective::AllReduce, base), first);
  struct Variant {
    const char* field;
    Collective collective;
    Shape shape;
  };
  std::vector<Variant> variants;
  auto vary = [&](const char* field, auto change, Collective c = Collective::AllReduce) {
    Shape shape = base;
    change(shape);
    variants.push_back({field, c, shape});
  };
  vary(
      "collective", [](Shape&) {}, Collective::Broadcast);
  vary("root", [](Shape& s) { s.root = 2; });
  vary("peer", [](Shape& s) { s.peer = 3; });
  vary("count", [](Shape& s) { s.count = 1001; });
  vary("chunkElems", [](Shape& s) { s.chunkElems = 128; });
  vary("alignElems", [](Shape& s) { s.alignElems = 2; });
  vary("elemSize", [](Shape& s) { s.elemSize = 8; });
  vary("mapped", [](Shape& s) { s.mapped = true; });
  std::vector<std::shared_ptr<const Plan>> seen{first};
  for (const Variant& v : variants) {
    const std::shared_ptr<const Plan> plan = cache.get(v.collective, v.shape);
    for (const auto& other : seen) EXPECT_NE(plan, other) << v.field;
    EXPECT_EQ(cache.get(v.collective, v.shape), plan) << v.field;
    EXPECT_EQ(cache.get(Collective::AllReduce, base), first) << "after " << v.field;
    seen.push_back(plan);
  }
}

tuning::Probe memoryProbe(double hop, double step, double copy, double reduce) {
  tuning::Probe p;
  p.smallSeconds = hop;
  p.largeSeconds = step;
  p.largeBytes = 256 * 1024;
  p.copyRate = copy;
  p.reduceRate = reduce;
  p.memoryLink = 1;
  return p;
}

// Pieces by address: the median rank decides, at the middle size only
// where they also win at the large one; where they win there, the fit
// sees the large steps by address.
TEST(Tuning, AddressCrossoverFollowsTheMedianRankAndFeedsTheFit) {
  auto probe = [](double middle, double middleAddress, double large, double largeAddress) {
    tuning::Probe p = memoryProbe(1e-6, large, 40e9, 30e9);
    p.middleBytes = 64 * 1024;
    p.middleSeconds = middle;
    p.middleAddressSeconds = middleAddress;
    p.largeAddressSeconds = largeAddress;
    return p;
  };
  // Faster at both sizes on two ranks of three (the third, preempted, not).
  std::vector<tuning::Probe> probes = {probe(30e-6, 7e-6, 140e-6, 21e-6),
                                       probe(33e-6, 6e-6, 142e-6, 20e-6),
                                       probe(6e-6, 60e-6, 20e-6, 200e-6)};
  EXPECT_EQ(tuning::addressCrossover(&probes), 64u * 1024);
  EXPECT_EQ(probes[0].largeSeconds, 21e-6);
  EXPECT_EQ(probes[2].largeSeconds, 200e-6);

  // Faster at the large size only.
  probes = {probe(6e-6, 7e-6, 40e-6, 21e-6), probe(6e-6, 7e-6, 40e-6, 21e-6)};
  EXPECT_EQ(tuning::addressCrossover(&probes), 256u * 1024);

  // Slower at the large size: never, and the fit keeps the slots' steps,
  // whatever the middle size says.
  probes = {probe(30e-6, 7e-6, 14e-6, 21e-6), probe(30e-6, 7e-6, 15e-6, 21e-6)};
  EXPECT_EQ(tuning::addressCrossover(&probes), 0u);
  EXPECT_EQ(probes[0].largeSeconds, 14e-6);

  // Not measured (BRAID_CMA_BYTES is a size, or no rank could read its
  // peers), or a NaN: never.
  probes = {memoryProbe(1e-6, 20e-6, 40e9, 30e9), memoryProbe(1e-6, 20e-6, 40e9, 30e9)};
  EXPECT_EQ(tuning::addressCrossover(&probes), 0u);
  probes = {probe(30e-6, std::nan(""), 40e-6, 21e-6)};
  EXPECT_EQ(tuning::addressCrossover(&probes), 0u);
}

// The copy path, op by op: a class starts from calibration's guess, tries
// each other path from its third op and then one every kTrialPeriod ops (a
// trial is two ops, of which the second is timed, and the op back on the
// class's path is not timed either), follows whichever is fastest by a
// margin, and moves at once when the one it took slows down (a virtual
// machine's vCPUs moved), though not for one slow op. Kinds and sizes to a
// power of two are classes of their own, small ops take plain slots, and
// without addresses only the two slot paths run.
TEST(Tuning, CopyChoiceTriesTheOtherPathsAndFollowsTheFastest) {
  using tuning::CopyChoice;
  using tuning::CopyPath;
  constexpr size_t kMiB = 1024 * 1024;
  constexpr unsigned kAllReduce = 0, kInPlace = 1;
  constexpr CopyPath S = CopyPath::Slots, T = CopyPath::StreamedSlots, A = CopyPath::Address;
  CopyChoice choice(true, 256 * 1024);  // calibration: by address from 256 KiB
  EXPECT_EQ(choice.chosen(kAllReduce, kMiB), A);
  EXPECT_EQ(choice.chosen(kAllReduce, 128 * 1024), S);
  EXPECT_EQ(choice.next(kAllReduce, CopyChoice::kSmallestOp / 2), S);
  EXPECT_EQ(choice.pieceFrom(), 256u * 1024);
  EXPECT_EQ(CopyChoice(true, 0).pieceFrom(), CopyChoice::kSmallestPiece);

  // Seconds per MiB of each path; each op records its time.
  double slots = 60e-6, streamed = 100e-6, address = 120e-6;
  std::string taken;
  auto run = [&](int ops) {
    for (int i = 0; i < ops; ++i) {
      const CopyPath path = choice.next(kAllReduce, kMiB);
      const double seconds[] = {slots, streamed, address};
      choice.record(kAllReduce, kMiB, path, seconds[static_cast<size_t>(path)]);
      taken += "STA"[static_cast<size_t>(path)];
    }
  };
  // The guess twice (the first untimed), slots twice (the second timed:
  // twice as fast, the class moves there), streamed twice (slower than
  // slots), then slots.
  run(1);
  EXPECT_EQ(choice.secondsPerByte(kAllReduce, kMiB, A), 0);
  run(7);
  EXPECT_EQ(taken, "AASSTTSS");
  EXPECT_EQ(choice.chosen(kAllReduce, kMiB), S);
  EXPECT_NEAR(choice.secondsPerByte(kAllReduce, kMiB, T), 100e-6 / kMiB, 1e-15);
  // The same size in place, and the next size up, have not moved.
  EXPECT_EQ(choice.chosen(kInPlace, kMiB), A);
  EXPECT_EQ(choice.chosen(kAllReduce, 2 * kMiB), A);

  // Slots stay while they are fastest; the next trial (streamed, twice)
  // starts kTrialPeriod ops after the first.
  taken.clear();
  run(static_cast<int>(CopyChoice::kTrialPeriod) - 6);
  EXPECT_EQ(taken, std::string(CopyChoice::kTrialPeriod - 6, 'S'));
  taken.clear();
  run(3);
  EXPECT_EQ(taken, "TTS");
  EXPECT_EQ(choice.chosen(kAllReduce, kMiB), S);

  // Slots slow down to 480 us (the cores no longer share a cache): one
  // such op could be an accident and moves nothing; the second brings their
  // median above the others' last times, and the class goes to the fastest
  // of those at once, without a trial.
  slots = 480e-6;
  taken.clear();
  run(2);
  EXPECT_EQ(taken, "SS");
  EXPECT_EQ(choice.chosen(kAllReduce, kMiB), T);
  // One slow op of the new path moves nothing either.
  const double streamedBefore = streamed;
  streamed = 900e-6;
  run(1);
  streamed = streamedBefore;
  run(1);
  EXPECT_EQ(taken, "SSTT");
  EXPECT_EQ(choice.chosen(kAllReduce, kMiB), T);

  // Within the margin (streamed 5% faster than slots) a class stays; with
  // no addresses its trials only ever stream.
  CopyChoice close(false, 0);
  for (int op = 0; op < 3 + static_cast<int>(CopyChoice::kTrialPeriod); ++op) {
    const CopyPath path = close.next(kAllReduce, kMiB);
    EXPECT_NE(path, A);
    close.record(kAllReduce, kMiB, path, path == T ? 95e-6 : 100e-6);
  }
  EXPECT_EQ(close.chosen(kAllReduce, kMiB), S);
  // An op that failed or took no time tells nothing.
  close.next(kAllReduce, kMiB);
  EXPECT_FALSE(close.record(kAllReduce, kMiB, T, 0));
}

// From 4 KiB to 128 KiB a class chooses between the two slot paths only
// (its pieces are too small to lend), times one op in eight of its own
// path besides its trials, and tries the other path less often the
// smaller it is.
TEST(Tuning, CopyChoiceOfSmallOpsTimesASampleAndNeverTriesAddresses) {
  using tuning::CopyChoice;
  using tuning::CopyPath;
  constexpr size_t kSize = 16 * 1024;
  CopyChoice choice(true, 4 * 1024);  // calibration: by address from 4 KiB
  EXPECT_EQ(choice.next(0, CopyChoice::kSmallestOp / 2), CopyPath::Slots);
  EXPECT_FALSE(choice.timesLast(0, CopyChoice::kSmallestOp / 2));
  EXPECT_EQ(choice.chosen(0, kSize), CopyPath::Slots);
  const uint64_t period = CopyChoice::trialPeriod(kSize);
  EXPECT_EQ(period, CopyChoice::kTrialPeriod * 8);
  EXPECT_EQ(CopyChoice::trialPeriod(CopyChoice::kSparseBelow), CopyChoice::kTrialPeriod);

  // Streamed slots take half the time of plain ones.
  std::string taken, timed;
  for (uint64_t op = 0; op < CopyChoice::kFirstTrial + 3 * period; ++op) {
    const CopyPath path = choice.next(0, kSize);
    taken += "STA"[static_cast<size_t>(path)];
    timed += choice.timesLast(0, kSize) ? 't' : '.';
    choice.record(0, kSize, path, path == CopyPath::StreamedSlots ? 5e-6 : 10e-6);
  }
  EXPECT_EQ(taken.find('A'), std::string::npos);
  // The guess (slots) twice, the second timed; the trial of streamed slots,
  // the second timed, and the class moves there; it comes back untimed,
  // then times every eighth op.
  EXPECT_EQ(taken.substr(0, 6), "SSTTTT");
  EXPECT_EQ(timed.substr(0, 14), ".t.t.t.......t");
  // The next round tries slots once (two ops) and stays.
  const size_t second = CopyChoice::kFirstTrial + period;
  EXPECT_EQ(taken.substr(second - 1, 4), "TSST");
  EXPECT_EQ(std::count(taken.begin(), taken.end(), 'S'), 6);
  EXPECT_EQ(std::count(timed.begin() + second, timed.begin() + second + period, 't'),
            1 + static_cast<long>(period / CopyChoice::kSampleEvery));
  EXPECT_EQ(choice.chosen(0, kSize), CopyPath::StreamedSlots);
  // Addresses start at 128 KiB, as a first guess and as a trial.
  EXPECT_EQ(choice.chosen(0, CopyChoice::kSmallestAddressOp - 1), CopyPath::Slots);
  EXPECT_EQ(choice.chosen(0, CopyChoice::kSmallestAddressOp), CopyPath::Address);
  // Ranks without addresses have their trials in the same ops as the others.
  CopyChoice without(false, 0);
  std::string mine;
  for (uint64_t op = 0; op < CopyChoice::kFirstTrial + 5; ++op) {
    const CopyPath path = without.next(0, CopyChoice::kSmallestAddressOp);
    mine += "STA"[static_cast<size_t>(path)];
  }
  EXPECT_EQ(mine, "SSTTTTS");
}

// The fit: a memory link's per-byte ring-step time splits evenly between
// the sender's and the receiver's copy; a network link keeps local copies at
// their local speed; medians resist one slow rank; bad probes fall back.
TEST(Tuning, FitLinkReadsTheRingStepAndFallsBackOnUnusableProbes) {
  LinkModel fallback;
  fallback.latency = 42e-6;
  const double bytes = 256 * 1024;
  // 10 GB/s each way: a step of 2 * bytes / 10 GB/s on top of a 1 us hop.
  const double step = 1e-6 + 2 * bytes / 10e9;
  std::vector<tuning::Probe> probes = {memoryProbe(1e-6, step, 40e9, 30e9),
                                       memoryProbe(1e-6, step, 40e9, 30e9),
                                       memoryProbe(100e-6, 100 * step, 40e9, 30e9)};
  LinkModel link = tuning::fitLink(probes, fallback);
  EXPECT_NEAR(link.latency, 1e-6, 1e-12);
  EXPECT_NEAR(link.bandwidth, 10e9, 1e6);
  EXPECT_NEAR(link.copyBandwidth, 10e9, 1e6);
  EXPECT_NEAR(link.reduceBandwidth, 30e9 * 10e9 / 40e9, 1e6);  // slowed like a copy

  // Network: local copies at 20 GB/s, the link takes the rest (5 GB/s).
  for (auto& p : probes) {
    p.memoryLink = 0;
    p.copyRate = 20e9;
    p.largeSeconds = p.smallSeconds + bytes / 5e9 + bytes / 20e9;
  }
  link = tuning::fitLink(probes, fallback);
  EXPECT_NEAR(link.bandwidth, 5e9, 1e6);
  EXPECT_NEAR(link.copyBandwidth, 20e9, 1e6);

  // Unusable: nobody measured; memory and network links mixed; a NaN; a
  // ring step no slower than a hop (nothing to split).
  EXPECT_EQ(tuning::fitLink({tuning::Probe{}, tuning::Probe{}}, fallback).latency, 42e-6);
  probes[0].memoryLink = 1;
  EXPECT_EQ(tuning::fitLink(probes, fallback).latency, 42e-6);
  probes[0].memoryLink = 0;
  probes[1].copyRate = std::nan("");
  EXPECT_EQ(tuning::fitLink(probes, fallback).latency, 42e-6);
  EXPECT_EQ(tuning::fitLink({memoryProbe(1e-6, 1e-6, 40e9, 30e9)}, fallback).latency, 42e-6);
}

// The contenders the measured tuner times: every algorithm that applies,
// predicted within the factor of the fastest, fastest first; choose() with
// the same model picks the first.
TEST(Tuning, ContendersAreTheAlgorithmsPredictedWithinTheFactorFastestFirst) {
  LinkModel link;
  link.latency = 3e-6;
  link.bandwidth = link.copyBandwidth = 9e9;
  link.reduceBandwidth = 7e9;
  for (size_t count : {size_t{2}, size_t{2048}, size_t{32768}, size_t{1} << 20}) {
    Shape shape;
    shape.nranks = 4;
    shape.count = count;
    shape.elemSize = 4;
    shape.chunkElems = (1 << 20) / 4;
    shape.alignElems = 16;
    SimOptions options;
    options.link = link;
    options.checkData = false;
    options.chunkBytes = 1 << 20;
    auto predict = [&](Algorithm a) {
      return simulate(Collective::AllReduce, a, 4, count, 0, options).seconds;
    };
    const std::vector<Algorithm> all = tuning::contenders(Collective::AllReduce, shape, link, 1e9);
    const std::vector<Algorithm> near = tuning::contenders(Collective::AllReduce, shape, link, 2.0);
    size_t applicable = 0;
    for (Algorithm a : algorithmsFor(Collective::AllReduce))
      applicable += applies(Collective::AllReduce, a, shape);
    EXPECT_EQ(all.size(), applicable) << count;
    ASSERT_FALSE(near.empty());
    for (size_t i = 1; i < all.size(); ++i)
      EXPECT_LE(predict(all[i - 1]), predict(all[i])) << count;
    for (Algorithm a : all) {
      const bool within = predict(a) <= 2.0 * predict(all[0]);
      EXPECT_EQ(within, std::find(near.begin(), near.end(), a) != near.end())
          << algorithmName(a) << " at count " << count;
    }
    EXPECT_LE(predict(tuning::choose(Collective::AllReduce, shape, {}, 4096, &link)),
              predict(all[0]) * 1.001);
  }
  Shape one;
  one.count = 100;
  EXPECT_TRUE(tuning::contenders(Collective::AllReduce, one, link, 2.0).empty());
}

}  // namespace
}  // namespace braid::algo
