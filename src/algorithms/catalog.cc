#include "algorithms/catalog.h"

#include <array>
#include <iterator>
#include <utility>

#include "algorithms/partition.h"
#include "algorithms/planners.h"

namespace braid::algo {
namespace {

constexpr std::pair<const char*, Collective> kCollectives[] = {
    {"allreduce", Collective::AllReduce},
    {"broadcast", Collective::Broadcast},
    {"reduce", Collective::Reduce},
    {"allgather", Collective::AllGather},
    {"reducescatter", Collective::ReduceScatter},
    {"send", Collective::Send},
    {"recv", Collective::Recv},
};
constexpr size_t kCollectiveCount = sizeof(kCollectives) / sizeof(kCollectives[0]);

// The rules. Their texts name kScratchBytes and kMaxDirectRanks by value.
static_assert(kScratchBytes == 64 * 1024 && kMaxDirectRanks == 8, "update the rules' texts");

constexpr Rule kAnyShape{"", [](const Shape&) { return true; }};
constexpr Rule kPowerOfTwoRanks{"a power-of-two rank count",
                                [](const Shape& shape) { return isPowerOfTwo(shape.nranks); }};
constexpr Rule kFitsScratchOrMapped{
    "a buffer of at most 64 KiB, or mapped buffers on at most 8 ranks", [](const Shape& shape) {
      return (shape.mapped && shape.nranks <= kMaxDirectRanks) ||
             shape.count * shape.elemSize <= kScratchBytes;
    }};
constexpr Rule kMapped{"mapped buffers", [](const Shape& shape) { return shape.mapped; }};
constexpr Rule kMappedOnFewRanks{"mapped buffers on at most 8 ranks", [](const Shape& shape) {
                                   return shape.mapped && shape.nranks <= kMaxDirectRanks;
                                 }};
constexpr Rule kSeveralHosts{
    "host buffers; ranks numbered host by host, at least 2 on each of at least 2 hosts",
    [](const Shape& shape) {
      return !shape.mapped && shape.localRanks >= 2 && shape.nranks % shape.localRanks == 0 &&
             shape.nranks / shape.localRanks >= 2;
    }};

// One-shot all-reduce reads mapped buffers where they are (direct.cc) and
// sends messages otherwise (one_shot_all_reduce.cc).
Plan oneShotAllReduceAnyBuffers(const Shape& shape) {
  return shape.mapped && shape.nranks <= kMaxDirectRanks ? oneShotMappedAllReduce(shape)
                                                         : oneShotAllReduce(shape);
}

using C = Collective;
using A = Algorithm;

// The table. A collective's first row applies at every shape: it is the
// fallback where nothing else does.
constexpr AlgorithmInfo kCatalog[] = {
    {C::AllReduce, A::Ring, "ring",
     "reduce-scatter then all-gather around the ring: 2(n-1) steps, 2(n-1)/n * S bytes per rank",
     kAnyShape, ringAllReduce},
    {C::AllReduce, A::Tree, "tree",
     "two binary trees, each reducing half the buffer up and broadcasting it down: "
     "2 log2(n) hops, about S bytes per rank",
     kAnyShape, treeAllReduce},
    {C::AllReduce, A::Rabenseifner, "rabenseifner",
     "recursive-halving reduce-scatter, recursive-doubling all-gather, on p = 2^floor(log2 n) "
     "ranks (the rest fold in): 2 log2(p) steps, 2(p-1)/p * S bytes per rank",
     kAnyShape, rabenseifnerAllReduce},
    {C::AllReduce, A::RecursiveDoubling, "recdoubling",
     "whole-buffer exchanges 1, 2, 4, ... ranks apart on p = 2^floor(log2 n) ranks (the rest "
     "fold in): log2(p) steps, log2(p) * S bytes per rank",
     kAnyShape, recursiveDoublingAllReduce},
    {C::AllReduce, A::OneShot, "oneshot",
     "every rank sends its input to every other and adds the n in rank order (mapped buffers: "
     "reads them in place): 1 hop, (n-1) * S bytes per rank",
     kFitsScratchOrMapped, oneShotAllReduceAnyBuffers},
    {C::AllReduce, A::TwoShot, "twoshot",
     "rank r reduces part r of every input where it is, then writes it into every output: "
     "(n-1)/n * S bytes read and as many written per rank",
     kMappedOnFewRanks, twoShotAllReduce},
    {C::AllReduce, A::Hierarchical, "hier",
     "reduce-scatter within each host, all-reduce across hosts, all-gather within: "
     "2(L-1)/L * S bytes per rank within a host, 2(H-1)/H * S/L across",
     kSeveralHosts, hierarchicalAllReduce},

    {C::Broadcast, A::Chain, "chain",
     "pipelined chain from the root: n-1 + chunks piece hops, S bytes per rank", kAnyShape,
     chainBroadcast},
    {C::Broadcast, A::Binomial, "binomial",
     "binomial tree from the root: ceil(log2 n) hops; the root sends up to log2(n) * S bytes, "
     "the others receive S",
     kAnyShape, binomialBroadcast},
    {C::Broadcast, A::ScatterAllGather, "scatter",
     "the root scatters n parts, the ring all-gathers them: 2(n-1) hops, about 2(n-1)/n * S "
     "bytes per rank",
     kAnyShape, scatterAllGatherBroadcast},
    {C::Broadcast, A::OneShot, "oneshot",
     "every rank reads the root's output where it is: S bytes per rank", kMapped, oneShotBroadcast},
    {C::Broadcast, A::Hierarchical, "hier",
     "part l of L down the chain of hosts among local ranks l, then all-gathered within each "
     "host: S/L bytes per rank across hosts, (L-1)/L * S within",
     kSeveralHosts, hierarchicalBroadcast},

    {C::Reduce, A::Chain, "chain",
     "pipelined chain ending at the root: n-1 + chunks piece hops, S bytes per rank", kAnyShape,
     chainReduce},
    {C::Reduce, A::Binomial, "binomial",
     "binomial tree to the root: ceil(log2 n) hops; a rank with c children receives c * S "
     "bytes and sends S",
     kAnyShape, binomialReduce},

    {C::AllGather, A::Ring, "ring", "n-1 steps around the ring: (n-1) * S bytes per rank",
     kAnyShape, ringAllGather},
    {C::AllGather, A::Bruck, "bruck",
     "ceil(log2 n) rounds at any rank count: (n-1) * S bytes per rank", kAnyShape, bruckAllGather},
    {C::AllGather, A::OneShot, "oneshot",
     "every rank writes its block into every output: (n-1) * S bytes per rank", kMapped,
     oneShotAllGather},
    {C::AllGather, A::Hierarchical, "hier",
     "across hosts among local ranks l, then around each host: (H-1) * S bytes per rank across "
     "hosts, (L-1) * H * S within",
     kSeveralHosts, hierarchicalAllGather},

    {C::ReduceScatter, A::Ring, "ring", "n-1 steps around the ring: (n-1) * S bytes per rank",
     kAnyShape, ringReduceScatter},
    {C::ReduceScatter, A::RecursiveHalving, "rechalving",
     "log2(n) steps, each halving the blocks a rank holds: (n-1) * S bytes per rank",
     kPowerOfTwoRanks, recursiveHalvingReduceScatter},
    {C::ReduceScatter, A::Hierarchical, "hier",
     "within each host, then across hosts among local ranks l: (L-1) * H * S bytes per rank "
     "within a host, (H-1) * S across",
     kSeveralHosts, hierarchicalReduceScatter},

    {C::Send, A::Direct, "direct", "one step: S bytes to the peer", kAnyShape, sendTo},
    {C::Recv, A::Direct, "direct", "one step: S bytes from the peer", kAnyShape, recvFrom},
};

constexpr bool sameText(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

// The table's shape: each collective's rows together, every collective
// with a first row that applies at every shape, no (collective, algorithm)
// twice, one name per algorithm and one algorithm per name.
constexpr bool wellFormed() {
  for (const AlgorithmInfo& row : kCatalog) {
    bool started = false, ended = false;
    for (const AlgorithmInfo& other : kCatalog) {
      const bool mine = other.collective == row.collective;
      if (mine && ended) return false;
      if (!mine && started) ended = true;
      if (mine && !started && other.rule.holds != kAnyShape.holds) return false;
      started = started || mine;
      if (&other != &row && mine && other.algorithm == row.algorithm) return false;
      if ((other.algorithm == row.algorithm) != sameText(other.name, row.name)) return false;
    }
  }
  return true;
}
static_assert(wellFormed(), "the catalog's rows are out of order, doubled or misnamed");

const AlgorithmInfo* find(Collective collective, Algorithm algorithm) {
  for (const AlgorithmInfo& row : kCatalog)
    if (row.collective == collective && row.algorithm == algorithm) return &row;
  return nullptr;
}

}  // namespace

const std::vector<AlgorithmInfo>& catalog() {
  static const std::vector<AlgorithmInfo> kRows(std::begin(kCatalog), std::end(kCatalog));
  return kRows;
}

const char* collectiveName(Collective collective) {
  for (const auto& [name, c] : kCollectives)
    if (c == collective) return name;
  return "invalid";
}

bool parseCollective(const std::string& name, Collective* collective) {
  for (const auto& [known, c] : kCollectives)
    if (name == known) {
      *collective = c;
      return true;
    }
  return false;
}

const char* algorithmName(Algorithm algorithm) {
  for (const AlgorithmInfo& row : kCatalog)
    if (row.algorithm == algorithm) return row.name;
  return "invalid";
}

bool parseAlgorithm(const std::string& name, Algorithm* algorithm) {
  for (const AlgorithmInfo& row : kCatalog)
    if (name == row.name) {
      *algorithm = row.algorithm;
      return true;
    }
  return false;
}

const std::vector<Algorithm>& algorithmsFor(Collective collective) {
  static const auto kByCollective = [] {
    std::array<std::vector<Algorithm>, kCollectiveCount> lists;
    for (const AlgorithmInfo& row : kCatalog)
      lists[static_cast<size_t>(row.collective)].push_back(row.algorithm);
    return lists;
  }();
  return kByCollective[static_cast<size_t>(collective)];
}

std::string algorithmNames(Collective collective, const char* separator) {
  std::string names;
  for (Algorithm a : algorithmsFor(collective))
    names += (names.empty() ? "" : separator) + std::string(algorithmName(a));
  return names;
}

bool applies(Collective collective, Algorithm algorithm, const Shape& shape) {
  const AlgorithmInfo* row = find(collective, algorithm);
  return row && row->rule.holds(shape);
}

size_t bufferBytes(Collective collective, const Shape& shape) {
  const bool gathered =
      collective == Collective::AllGather || collective == Collective::ReduceScatter;
  return shape.count * shape.elemSize * (gathered ? static_cast<size_t>(shape.nranks) : 1);
}

Plan makePlan(Collective collective, Algorithm algorithm, const Shape& shape) {
  const AlgorithmInfo* row = find(collective, algorithm);
  // Against the REQUIRES, an algorithm the collective lacks: its first one.
  if (!row) row = find(collective, algorithmsFor(collective).front());
  return row->plan(shape);
}

}  // namespace braid::algo
