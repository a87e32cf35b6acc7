// Every collective against the independent reference of reference.h, over
// real ranks (forked processes) meeting through a UniqueId.
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/catalog.h"
#include "core/errors.h"
#include "multirank.h"
#include "reference.h"

namespace braid::testing {
namespace {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter };

const char* collName(Coll c) {
  static const char* const kNames[] = {"allReduce", "broadcast", "reduce", "allGather",
                                       "reduceScatter"};
  return kNames[static_cast<int>(c)];
}

const std::vector<DataType> kAllTypes = {
    DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
    DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
    DataType::Float64, DataType::BFloat16, DataType::Float8E4M3, DataType::Float8E5M2};
const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                                       ReduceOp::Avg};
const std::vector<size_t> kSmallCounts = {0, 1, 7, 1023, (1 << 16) + 3};
const size_t kLargeCount = (1 << 20) + 3;

struct Case {
  Coll coll;
  DataType type;
  ReduceOp op;
  size_t count;  // per rank for all-gather and reduce-scatter
  bool inPlace;
  int root;
};

// Where the buffers of the cases live: ordinary memory, or braid::memAlloc
// memory that same-host peers read in place (set for a whole test).
bool gRegistered = false;

// A case's buffer, filled with poison.
class Buffer {
 public:
  Buffer(DataType type, size_t count) : bytes_(poisoned(type, count)) {
    if (gRegistered) {
      memory_ = static_cast<std::byte*>(memAlloc(std::max<size_t>(bytes_.size(), 1)));
      if (!bytes_.empty()) std::memcpy(memory_, bytes_.data(), bytes_.size());
    }
  }
  ~Buffer() { memFree(memory_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::byte* data() { return memory_ ? memory_ : bytes_.data(); }

 private:
  std::vector<std::byte> bytes_;
  std::byte* memory_ = nullptr;
};

// For the rest of a test: buffers from memAlloc, and every piece of 64
// bytes or more of them sent by reference.
class RegisteredBuffers {
 public:
  RegisteredBuffers() {
    gRegistered = true;
    ::setenv("BRAID_DIRECT_BYTES", "64", 1);
  }
  ~RegisteredBuffers() {
    gRegistered = false;
    ::unsetenv("BRAID_DIRECT_BYTES");
  }
};

std::string label(const Case& c, int nranks) {
  return std::string(collName(c.coll)) + " " + dataTypeName(c.type) + " " + reduceOpName(c.op) +
         " count " + std::to_string(c.count) + (c.inPlace ? " in place" : " out of place") +
         " root " + std::to_string(c.root) + " at " + std::to_string(nranks) + " ranks: ";
}

// Runs one case on this rank and checks its result; "" when right.
std::string runCase(Communicator& comm, const Case& c, uint64_t seed) {
  const int n = comm.size(), r = comm.rank();
  const size_t size = dataTypeSize(c.type);
  auto at = [&](Buffer& b, size_t element) { return b.data() + element * size; };
  std::string problem;
  switch (c.coll) {
    case Coll::AllReduce: {
      Buffer send(c.type, c.count), recv(c.type, c.count);
      fillInput(c.type, c.op, seed, r, 0, c.count, send.data());
      void* out = c.inPlace ? send.data() : recv.data();
      comm.allReduce(send.data(), out, c.count, c.type, c.op);
      problem = checkReduced(c.type, c.op, seed, n, 0, c.count, out);
      if (problem.empty() && !c.inPlace)
        problem = checkCopied(c.type, c.op, seed, r, 0, c.count, send.data());
      break;
    }
    case Coll::Broadcast: {
      Buffer send(c.type, c.count), recv(c.type, c.count);
      if (r == c.root)
        fillInput(c.type, c.op, seed, r, 0, c.count, c.inPlace ? recv.data() : send.data());
      const void* in = c.inPlace ? recv.data() : (r == c.root ? send.data() : nullptr);
      comm.broadcast(in, recv.data(), c.count, c.type, c.root);
      problem = checkCopied(c.type, c.op, seed, c.root, 0, c.count, recv.data());
      break;
    }
    case Coll::Reduce: {
      Buffer send(c.type, c.count), recv(c.type, c.count);
      fillInput(c.type, c.op, seed, r, 0, c.count, send.data());
      void* out = c.inPlace ? send.data() : (r == c.root ? recv.data() : nullptr);
      comm.reduce(send.data(), out, c.count, c.type, c.op, c.root);
      if (r == c.root) problem = checkReduced(c.type, c.op, seed, n, 0, c.count, out);
      break;
    }
    case Coll::AllGather: {
      Buffer send(c.type, c.count), recv(c.type, c.count * n);
      void* in = c.inPlace ? at(recv, r * c.count) : send.data();
      fillInput(c.type, c.op, seed, r, 0, c.count, in);
      comm.allGather(in, recv.data(), c.count, c.type);
      for (int b = 0; b < n && problem.empty(); ++b)
        problem = checkCopied(c.type, c.op, seed, b, 0, c.count, at(recv, b * c.count));
      break;
    }
    case Coll::ReduceScatter: {
      Buffer send(c.type, c.count * n), recv(c.type, c.count);
      fillInput(c.type, c.op, seed, r, 0, c.count * n, send.data());
      void* out = c.inPlace ? at(send, r * c.count) : recv.data();
      comm.reduceScatter(send.data(), out, c.count, c.type, c.op);
      problem = checkReduced(c.type, c.op, seed, n, r * c.count, c.count, out);
      break;
    }
  }
  return problem.empty() ? "" : label(c, n) + (gRegistered ? "(memAlloc buffers) " : "") + problem;
}

bool reduces(Coll c) {
  return c == Coll::AllReduce || c == Coll::Reduce || c == Coll::ReduceScatter;
}

// Runs every combination on `nranks` ranks, in the same order on each.
void sweep(int nranks, Coll coll, const std::vector<DataType>& types,
           const std::vector<ReduceOp>& ops, const std::vector<size_t>& counts,
           const std::vector<int>& roots = {0}) {
  runRanks(nranks, [&](Communicator& comm) {
    uint64_t seed = 1;
    for (DataType type : types)
      for (ReduceOp op : reduces(coll) ? ops : std::vector<ReduceOp>{ReduceOp::Sum})
        for (size_t count : counts)
          for (int root : roots)
            for (bool inPlace : {false, true}) {
              std::string problem = runCase(comm, {coll, type, op, count, inPlace, root}, ++seed);
              require(problem.empty(), problem);
            }
  });
}

const std::vector<DataType> kCommonTypes = {DataType::Int32, DataType::Float32, DataType::BFloat16,
                                            DataType::Float8E5M2};
const std::vector<ReduceOp> kCommonOps = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg};

TEST(AllReduce, EveryTypeAndOpMatchesReferenceAt3Ranks) {
  sweep(3, Coll::AllReduce, kAllTypes, kAllOps, kSmallCounts);
}
TEST(AllReduce, LargeBuffersMatchReferenceAt3Ranks) {
  sweep(3, Coll::AllReduce, {DataType::Int8, DataType::Float32, DataType::Float16}, kAllOps,
        {kLargeCount});
}
TEST(AllReduce, MatchesReferenceAt2Ranks) {
  sweep(2, Coll::AllReduce, kCommonTypes, kCommonOps, {0, 1, 7, 1023, kLargeCount});
}
TEST(AllReduce, MatchesReferenceAt5Ranks) {
  sweep(5, Coll::AllReduce, kCommonTypes, kCommonOps, {0, 1, 7, 1023, kLargeCount});
}
TEST(AllReduce, MatchesReferenceAt8Ranks) {
  sweep(8, Coll::AllReduce, {DataType::Int32, DataType::Float32}, {ReduceOp::Sum, ReduceOp::Prod},
        {0, 1, 7, 1023, kLargeCount});
}

TEST(Broadcast, EveryTypeFromEveryRootAt3Ranks) {
  sweep(3, Coll::Broadcast, kAllTypes, {}, kSmallCounts, {0, 1, 2});
}
TEST(Broadcast, MatchesReferenceAt2And5And8Ranks) {
  sweep(2, Coll::Broadcast, {DataType::Float32}, {}, {0, 1, 7, 1023, kLargeCount}, {0, 1});
  sweep(5, Coll::Broadcast, {DataType::Uint8, DataType::Float64}, {}, {1, 7, 1023, kLargeCount},
        {0, 3});
  sweep(8, Coll::Broadcast, {DataType::Int64}, {}, {1, 1023, kLargeCount}, {5});
}

TEST(Reduce, EveryTypeOpAndRootAt3Ranks) {
  sweep(3, Coll::Reduce, kAllTypes, kAllOps, {0, 1, 7, 1023, 4099}, {0, 1, 2});
}
TEST(Reduce, MatchesReferenceAt2And5And8Ranks) {
  sweep(2, Coll::Reduce, kCommonTypes, kCommonOps, {1, 1023, kLargeCount}, {1});
  sweep(5, Coll::Reduce, kCommonTypes, kCommonOps, {1, 7, 1023, kLargeCount}, {0, 4});
  sweep(8, Coll::Reduce, {DataType::Float32}, {ReduceOp::Sum}, {1, 1023, kLargeCount}, {6});
}

TEST(AllGather, EveryTypeAt3Ranks) { sweep(3, Coll::AllGather, kAllTypes, {}, kSmallCounts); }
TEST(AllGather, MatchesReferenceAt2And5And8Ranks) {
  sweep(2, Coll::AllGather, kCommonTypes, {}, {0, 1, 7, 1023, kLargeCount});
  sweep(5, Coll::AllGather, kCommonTypes, {}, {0, 1, 7, 1023, kLargeCount / 4});
  sweep(8, Coll::AllGather, {DataType::Float32}, {}, {1, 7, 1023, kLargeCount / 8});
}

TEST(ReduceScatter, EveryTypeAndOpAt3Ranks) {
  sweep(3, Coll::ReduceScatter, kAllTypes, kAllOps, kSmallCounts);
}
TEST(ReduceScatter, MatchesReferenceAt2And5And8Ranks) {
  sweep(2, Coll::ReduceScatter, kCommonTypes, kCommonOps, {0, 1, 7, 1023, kLargeCount});
  sweep(5, Coll::ReduceScatter, kCommonTypes, kCommonOps, {0, 1, 7, 1023, kLargeCount / 4});
  sweep(8, Coll::ReduceScatter, {DataType::Float32}, {ReduceOp::Sum},
        {1, 7, 1023, kLargeCount / 8});
}

// For the rest of a test: BRAID_ALGO set to `algorithms`.
class ForcedAlgorithm {
 public:
  explicit ForcedAlgorithm(const std::string& algorithms) {
    ::setenv("BRAID_ALGO", algorithms.c_str(), 1);
  }
  ~ForcedAlgorithm() { ::unsetenv("BRAID_ALGO"); }
};

algo::Collective catalogCollective(Coll c) {
  constexpr algo::Collective kCollectives[] = {
      algo::Collective::AllReduce, algo::Collective::Broadcast, algo::Collective::Reduce,
      algo::Collective::AllGather, algo::Collective::ReduceScatter};
  return kCollectives[static_cast<int>(c)];
}

// Every algorithm the catalog has for `coll` that applies at some case of
// a sweep over `nranks` ranks (host buffers, ranks on one host, as these
// tests run them), forced through BRAID_ALGO on real ranks, each over the
// whole sweep at every rank count: where it does not apply at a case, e.g.
// recursive halving at 3 ranks, braid falls back to its default and the
// results must still be right. Broadcast and reduce from the first and the
// last rank.
void sweepEveryAlgorithm(const std::vector<int>& nranks, Coll coll,
                         const std::vector<DataType>& types, const std::vector<ReduceOp>& ops,
                         const std::vector<size_t>& counts) {
  const algo::Collective collective = catalogCollective(coll);
  for (algo::Algorithm a : algo::algorithmsFor(collective)) {
    bool applies = false;
    for (int n : nranks)
      for (DataType type : types)
        for (size_t count : counts) {
          algo::Shape shape;
          shape.nranks = n;
          shape.localRanks = n;
          shape.count = count;
          shape.elemSize = dataTypeSize(type);
          applies = applies || algo::applies(collective, a, shape);
        }
    if (!applies) continue;
    const std::string choice =
        std::string(algo::collectiveName(collective)) + ":" + algo::algorithmName(a);
    SCOPED_TRACE("BRAID_ALGO=" + choice);
    ForcedAlgorithm forced(choice);
    const bool rooted = coll == Coll::Broadcast || coll == Coll::Reduce;
    for (int n : nranks)
      sweep(n, coll, types, ops, counts, rooted ? std::vector<int>{0, n - 1} : std::vector<int>{0});
  }
}

TEST(Algorithms, EveryAllReduceAlgorithmMatchesTheReference) {
  sweepEveryAlgorithm({2, 3, 5, 8}, Coll::AllReduce,
                      {DataType::Int32, DataType::Float32, DataType::BFloat16},
                      {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}, {1, 7, 1023, 70001});
}
TEST(Algorithms, EveryBroadcastAlgorithmMatchesTheReference) {
  sweepEveryAlgorithm({2, 3, 5, 8}, Coll::Broadcast,
                      {DataType::Uint8, DataType::Float32, DataType::Float64}, {},
                      {1, 7, 1023, kLargeCount});
}
TEST(Algorithms, EveryReduceAlgorithmMatchesTheReference) {
  sweepEveryAlgorithm({2, 3, 5, 8}, Coll::Reduce, {DataType::Int32, DataType::Float32},
                      {ReduceOp::Sum, ReduceOp::Min}, {1, 1023, 70001});
}
TEST(Algorithms, EveryAllGatherAlgorithmMatchesTheReference) {
  sweepEveryAlgorithm({2, 3, 5, 8}, Coll::AllGather, {DataType::Int8, DataType::Float32}, {},
                      {1, 7, 1023, 70001});
}
TEST(Algorithms, EveryReduceScatterAlgorithmMatchesTheReference) {
  sweepEveryAlgorithm({2, 3, 5, 8}, Coll::ReduceScatter, {DataType::Int32, DataType::Float32},
                      {ReduceOp::Sum, ReduceOp::Avg}, {1, 7, 1023, 70001});
}

// The same collectives with buffers from memAlloc: same-host peers read
// them in place (each piece of 64 bytes or more), in place and out of place.
TEST(MemAllocBuffers, AllReduceAt2And3And5And8Ranks) {
  RegisteredBuffers registered;
  for (int n : {2, 3, 5, 8})
    sweep(n, Coll::AllReduce, {DataType::Int32, DataType::Float32}, {ReduceOp::Sum, ReduceOp::Max},
          {0, 7, 1023, 70001, kLargeCount});
}
TEST(MemAllocBuffers, BroadcastAndReduceAt2And3And5Ranks) {
  RegisteredBuffers registered;
  for (int n : {2, 3, 5}) {
    sweep(n, Coll::Broadcast, {DataType::Float64}, {}, {7, 1023, kLargeCount}, {0, n - 1});
    sweep(n, Coll::Reduce, {DataType::Int32}, {ReduceOp::Sum}, {7, 1023, kLargeCount}, {n - 1});
  }
}
TEST(MemAllocBuffers, AllGatherAndReduceScatterAt2And3And5Ranks) {
  RegisteredBuffers registered;
  for (int n : {2, 3, 5}) {
    sweep(n, Coll::AllGather, {DataType::Uint8, DataType::Float32}, {}, {7, 1023, kLargeCount / 4});
    sweep(n, Coll::ReduceScatter, {DataType::Float32}, {ReduceOp::Sum, ReduceOp::Min},
          {7, 1023, kLargeCount / 4});
  }
}

// The resident memory of this process, in bytes, once the allocator has
// handed back what it only keeps cached (a leak stays counted).
size_t residentBytes() {
  ::malloc_trim(0);
  long pages = 0, resident = 0;
  if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  return static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// The soak: BRAID_SOAK_OPS random collectives (default 1,000; the full run is
// BRAID_SOAK_OPS=100000 build/bin/collectives_test --gtest_filter='Soak.*')
// at 4 ranks, each a random collective, buffer of 0 to 4 MiB (sizes spread
// evenly over their powers of two), type, op, root and in place or not, the
// same sequence on every rank, each checked against the reference, after a
// warm-up of every collective at 4 MiB. No wrong result, and each rank's
// resident memory grows less than 5% from the end of the first tenth to the
// end.
TEST(Soak, RandomCollectivesAt4RanksStayExactAndResidentMemoryStaysFlat) {
  const char* env = std::getenv("BRAID_SOAK_OPS");
  const long ops = env && *env ? std::atol(env) : 1000;
  ASSERT_GT(ops, 0) << "BRAID_SOAK_OPS";
  RunOptions options;
  options.deadline = std::chrono::seconds(3600);
  runRanks(
      4,
      [&](Communicator& comm) {
        // Warm-up: every collective at the largest size, for each element
        // size, in place and not, so that the buffers, scratch areas and
        // trials of the largest calls are behind the baseline.
        uint64_t seed = 1u << 30;
        for (int coll = 0; coll < 5; ++coll)
          for (DataType type :
               {DataType::Uint8, DataType::BFloat16, DataType::Float32, DataType::Float64})
            for (bool inPlace : {false, true}) {
              Case c{static_cast<Coll>(coll),
                     type,
                     ReduceOp::Sum,
                     (size_t{4} << 20) / dataTypeSize(type),
                     inPlace,
                     0};
              if (c.coll == Coll::AllGather || c.coll == Coll::ReduceScatter) c.count /= 4;
              const std::string problem = runCase(comm, c, ++seed);
              require(problem.empty(), "warm-up: " + problem);
            }
        std::mt19937_64 random(20261129);  // the same choices on every rank
        size_t warm = 0;
        for (long i = 0; i < ops; ++i) {
          Case c{};
          c.coll = static_cast<Coll>(random() % 5);
          c.type = kAllTypes[random() % kAllTypes.size()];
          c.op = reduces(c.coll) ? kAllOps[random() % kAllOps.size()] : ReduceOp::Sum;
          const int power = static_cast<int>(random() % 23);  // 1 B .. 4 MiB
          size_t bytes = power == 0
                             ? random() % 2
                             : (size_t{1} << (power - 1)) + random() % (size_t{1} << (power - 1));
          c.count = bytes / dataTypeSize(c.type);
          if (c.coll == Coll::AllGather || c.coll == Coll::ReduceScatter) c.count /= 4;
          c.inPlace = random() % 2;
          c.root = static_cast<int>(random() % 4);
          const std::string problem = runCase(comm, c, static_cast<uint64_t>(i) + 1);
          require(problem.empty(), format("op %ld: ", i) + problem);
          if (i + 1 == std::max<long>(1, ops / 10)) warm = residentBytes();
        }
        const size_t end = residentBytes();
        std::fprintf(stderr,
                     "soak: rank %d: %ld ops, resident %zu -> %zu bytes after the warm-up\n",
                     comm.rank(), ops, warm, end);
        require(end <= warm + warm / 20,
                format("resident memory grew from %zu to %zu bytes (%.1f%%) after the warm-up",
                       warm, end, 100.0 * (double(end) - double(warm)) / double(warm)));
      },
      options);
}

}  // namespace
}  // namespace braid::testing
