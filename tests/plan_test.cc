// Every planner in the plan simulator (algorithms/simulate.h), without
// processes: every receive matched by a send of the same size, no deadlock
// and no message left over, settled marks true, and every rank ending with
// the collective's exact integer result, at every rank count from 1 to 64
// and at 127, 128, 255, 256, 1000 and 1024 ranks.
#include "algorithms/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "algorithms/catalog.h"
#include "algorithms/simulate.h"

namespace braid::algo {
namespace {

constexpr Collective kCollectives[] = {Collective::AllReduce, Collective::Broadcast,
                                       Collective::Reduce, Collective::AllGather,
                                       Collective::ReduceScatter};

bool gathered(Collective c) { return c == Collective::AllGather || c == Collective::ReduceScatter; }

// Every algorithm of every collective on n ranks, over `counts` (per rank for
// the gathered collectives, which get `gatheredCounts`), from two roots.
void checkAll(int n, const std::vector<size_t>& counts, const std::vector<size_t>& gatheredCounts,
              size_t chunkBytes) {
  SimOptions options;
  options.elemSize = 8;
  options.chunkBytes = chunkBytes;
  for (Collective c : kCollectives)
    for (Algorithm a : algorithmsFor(c))
      for (size_t count : gathered(c) ? gatheredCounts : counts)
        for (int root : {0, n - 1}) {
          if (root != 0 && c != Collective::Broadcast && c != Collective::Reduce) continue;
          Shape shape;
          shape.nranks = n;
          shape.count = count;
          shape.elemSize = options.elemSize;
          if (!applies(c, a, shape)) continue;
          // The one-shot plan has every rank's input in flight to every
          // rank at once: n^2 * count elements, kept small at large n.
          if (a == Algorithm::OneShot && n > 64 && count > 40) continue;
          SimResult result = simulate(c, a, n, count, root, options);
          ASSERT_EQ(result.problem, "")
              << collectiveName(c) << " " << algorithmName(a) << " at " << n << " ranks, count "
              << count << ", root " << root << ", chunk " << chunkBytes << " bytes";
        }
}

TEST(Plans, EveryAlgorithmIsExactAtEveryRankCountFrom1To64) {
  for (int n = 1; n <= 64; ++n) {
    // Counts below, at and above the rank count; chunks of 8 elements make
    // the planners pipeline even these small buffers.
    checkAll(n, {0, 1, 5, static_cast<size_t>(n) + 3, 1000}, {0, 1, 3, 17}, 16);
    checkAll(n, {static_cast<size_t>(3 * n + 1), 1000}, {2, 9}, 1 << 20);
  }
}

TEST(Plans, EveryAlgorithmIsExactAtHundredsAndThousandsOfRanks) {
  for (int n : {127, 128, 255, 256, 1000, 1024}) checkAll(n, {0, 3, 40, 2000}, {0, 1, 2}, 1 << 12);
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

}  // namespace
}  // namespace braid::algo
