// Device buffers: every collective and send/recv on device memory, NCCL's
// stream semantics, bad arguments and faults. Each test runs once per
// device: on the emulated device (host memory posing as a GPU) everywhere,
// and on CUDA where a GPU is present; an instance whose device is missing
// skips, saying why. Ranks are forked processes, several on one device.
#include "device/device.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <thread>
#include <vector>

#include "algorithms/catalog.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "device_cases.h"
#include "device_support.h"
#include "multirank.h"
#include "reference.h"

namespace braid::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

int deviceOf(const Communicator&) { return device::current()->current(); }

const std::vector<DataType> kAllTypes = {
    DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
    DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
    DataType::Float64, DataType::BFloat16, DataType::Float8E4M3, DataType::Float8E5M2};
const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                                       ReduceOp::Avg};
const std::vector<DataType> kCommonTypes = {DataType::Int32, DataType::Float32, DataType::BFloat16,
                                            DataType::Float8E5M2};
const std::vector<ReduceOp> kCommonOps = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg};
// Odd counts, one that spans several 64 KiB slots and pipeline chunks.
const std::vector<size_t> kCounts = {0, 1, 7, 1023, (1 << 16) + 3};

class DeviceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << "no " << GetParam() << " device here: " << why;
    // Small slots, so that modest counts cross many slots and chunks.
    ::setenv("BRAID_DEVICE_SLOT_BYTES", "64K", 1);
  }
  void TearDown() override { ::unsetenv("BRAID_DEVICE_SLOT_BYTES"); }

  // Each rank selects this test's device before its communicator exists.
  RunOptions options() const {
    RunOptions options;
    const std::string backend = GetParam();
    options.enter = [backend](int) { device::select(backend); };
    return options;
  }

  void sweep(int nranks, const std::vector<Coll>& colls, const std::vector<DataType>& types,
             const std::vector<ReduceOp>& ops, const std::vector<size_t>& counts,
             bool everyRoot = false) {
    runRanks(
        nranks,
        [&](Communicator& comm) {
          TestStream stream(deviceOf(comm));
          uint64_t seed = 1;
          std::vector<int> roots = {0};
          if (everyRoot)
            for (int r = 1; r < nranks; ++r) roots.push_back(r);
          for (Coll coll : colls)
            for (DataType type : types)
              for (ReduceOp op : reduces(coll) ? ops : std::vector<ReduceOp>{ReduceOp::Sum})
                for (size_t count : counts)
                  for (int root : (coll == Coll::Broadcast || coll == Coll::Reduce)
                                      ? roots
                                      : std::vector<int>{0})
                    for (bool inPlace : {false, true}) {
                      const std::string problem =
                          runCase(comm, stream, {coll, type, op, count, inPlace, root}, ++seed);
                      require(problem.empty(), problem);
                    }
        },
        options());
  }
};

// ---- Every collective against the reference.

TEST_P(DeviceTest, EveryCollectiveTypeAndOpMatchesTheReferenceAt3Ranks) {
  sweep(3, kAllColls, kAllTypes, kAllOps, kCounts, /*everyRoot=*/true);
}

TEST_P(DeviceTest, EveryCollectiveMatchesTheReferenceAt1And2And5Ranks) {
  for (int nranks : {1, 2, 5}) sweep(nranks, kAllColls, kCommonTypes, kCommonOps, kCounts);
}

// Suspending frees the ops' device scratch and refuses ops until resume,
// which makes it again; the FIFOs stay; collectives before and after match
// the reference.
TEST_P(DeviceTest, SuspendFreesTheScratchAndResumeMakesItAgain) {
  runRanks(
      3,
      [](Communicator& comm) {
        TestStream stream(deviceOf(comm));
        const Case large{
            Coll::AllReduce, DataType::Float32, ReduceOp::Sum, (size_t{1} << 20) + 3, false, 0};
        require(runCase(comm, stream, large, 1).empty(), "the all-reduce before suspending");
        const Communicator::MemoryStats before = comm.memoryStats();
        require(before.suspendable > 0 && before.persistent > 0 && !before.suspended,
                format("before: %llu suspendable, %llu persistent bytes",
                       static_cast<unsigned long long>(before.suspendable),
                       static_cast<unsigned long long>(before.persistent)));
        comm.suspend();
        const Communicator::MemoryStats suspended = comm.memoryStats();
        require(suspended.suspended && suspended.suspendable == 0 &&
                    suspended.persistent == before.persistent,
                format("suspended: %llu suspendable, %llu persistent bytes",
                       static_cast<unsigned long long>(suspended.suspendable),
                       static_cast<unsigned long long>(suspended.persistent)));
        try {
          runCase(comm, stream, large, 2);
          require(false, "an all-reduce ran on a suspended communicator");
        } catch (const Error& error) {
          require(error.code() == ErrorCode::InvalidUsage &&
                      std::string(error.what()).find("suspended") != std::string::npos,
                  std::string("refused with: ") + error.what());
        }
        comm.resume();
        const Communicator::MemoryStats resumed = comm.memoryStats();
        require(!resumed.suspended && resumed.suspendable == before.suspendable,
                format("resumed: %llu suspendable bytes, %llu before",
                       static_cast<unsigned long long>(resumed.suspendable),
                       static_cast<unsigned long long>(before.suspendable)));
        require(runCase(comm, stream, large, 3).empty(), "the all-reduce after resuming");
      },
      options());
}

TEST_P(DeviceTest, LargeBuffersMatchTheReferenceAt2And3Ranks) {
  for (int nranks : {2, 3})
    sweep(nranks, kAllColls, {DataType::Float32, DataType::BFloat16}, {ReduceOp::Sum},
          {(size_t{1} << 20) + 3});
}

// Every all-reduce algorithm of the catalog that applies to these device
// buffers (outside any registered window: not mapped) of ranks on one
// host, forced through BRAID_ALGO, up to a count of several slots, or of
// 4096 elements (16 KiB) for one that needs a buffer that small (one-shot:
// its scratch area).
TEST_P(DeviceTest, EveryAllReduceAlgorithmMatchesTheReferenceAt3And4Ranks) {
  const algo::Collective allReduce = algo::Collective::AllReduce;
  auto applies = [&](algo::Algorithm a, size_t count) {
    bool all = true;
    for (int nranks : {3, 4}) {
      algo::Shape shape;
      shape.nranks = nranks;
      shape.localRanks = nranks;
      shape.count = count;
      shape.elemSize = 4;
      all = all && algo::applies(allReduce, a, shape);
    }
    return all;
  };
  for (algo::Algorithm a : algo::algorithmsFor(allReduce)) {
    if (!applies(a, 1)) continue;
    const size_t large = applies(a, (size_t{1} << 16) + 3) ? (size_t{1} << 16) + 3 : 4096;
    const std::string choice = std::string("allreduce:") + algo::algorithmName(a);
    SCOPED_TRACE("BRAID_ALGO=" + choice);
    ::setenv("BRAID_ALGO", choice.c_str(), 1);
    for (int nranks : {3, 4})
      sweep(nranks, {Coll::AllReduce}, {DataType::Int32, DataType::Float32}, {ReduceOp::Sum},
            {1, 1023, large});
  }
  ::unsetenv("BRAID_ALGO");
}

// Ranks on different devices of the host (Config::device), reaching each
// other's FIFOs through peer access: every collective still matches.
TEST_P(DeviceTest, RanksOnDifferentDevicesMatchTheReference) {
  RunOptions run = options();
  const std::string backend = GetParam();
  run.enter = [backend](int rank) {
    device::select(backend);
    device::Device* device = device::current();
    if (device && device->count() > 1) device->setCurrent(rank % device->count());
  };
  runRanks(
      3,
      [](Communicator& comm) {
        require(comm.device() == device::current()->current(),
                format("the communicator's device is %d, the current one %d", comm.device(),
                       device::current()->current()));
        const int devices = device::current()->count();
        const std::vector<std::string> paths = braid::detail::peerDevicePaths(comm);
        for (int peer = 0; peer < comm.size(); ++peer)
          if (peer != comm.rank() && devices > 1)
            require(
                paths[peer] == (peer % devices == comm.rank() % devices ? "cuda_ipc: same device"
                                                                        : "cuda_ipc: peer access"),
                format("rank %d is reached by '%s'", peer, paths[peer].c_str()));
        TestStream stream(deviceOf(comm));
        uint64_t seed = 7;
        for (Coll coll : kAllColls)
          for (DataType type : {DataType::Int32, DataType::BFloat16})
            for (size_t count : {size_t{1}, size_t{1023}, (size_t{1} << 16) + 3}) {
              const std::string problem =
                  runCase(comm, stream, {coll, type, ReduceOp::Sum, count, false, 1}, ++seed);
              require(problem.empty(), problem);
            }
      },
      run);
}

// Devices without peer access (BRAID_EMULATED_PEER_ACCESS=0 on the
// emulated device): the FIFOs between them are staged through host memory,
// and every collective still matches.
TEST_P(DeviceTest, DevicesWithoutPeerAccessStageThroughHostMemory) {
  const bool emulated = std::string(GetParam()) == "emulated";
  ::setenv("BRAID_EMULATED_PEER_ACCESS", "0", 1);
  RunOptions run = options();
  const std::string backend = GetParam();
  run.enter = [backend](int rank) {
    device::select(backend);
    device::Device* device = device::current();
    if (device && device->count() > 1) device->setCurrent(rank % 2);
  };
  runRanks(
      3,
      [emulated](Communicator& comm) {
        const std::vector<std::string> paths = braid::detail::peerDevicePaths(comm);
        for (int peer = 0; peer < comm.size() && emulated; ++peer)
          if (peer % 2 != comm.rank() % 2)
            require(paths[peer] == "cuda_ipc: staged through host memory",
                    format("rank %d is reached by '%s'", peer, paths[peer].c_str()));
        TestStream stream(deviceOf(comm));
        uint64_t seed = 11;
        for (Coll coll : kAllColls)
          for (DataType type : {DataType::Float32, DataType::Int8})
            for (size_t count : {size_t{7}, (size_t{1} << 16) + 3}) {
              const std::string problem =
                  runCase(comm, stream, {coll, type, ReduceOp::Max, count, true, 2}, ++seed);
              require(problem.empty(), problem);
            }
      },
      run);
  ::unsetenv("BRAID_EMULATED_PEER_ACCESS");
}

// Every collective, summing `type` at 5 elements and at 2^16 + 3, matches
// the reference (the seeds count up from `seed`).
void requireEveryCollectiveMatches(Communicator& comm, DataType type, bool inPlace, uint64_t seed) {
  TestStream stream(deviceOf(comm));
  for (Coll coll : kAllColls)
    for (size_t count : {size_t{5}, (size_t{1} << 16) + 3}) {
      const std::string problem =
          runCase(comm, stream, {coll, type, ReduceOp::Sum, count, inPlace, 1}, ++seed);
      require(problem.empty(), problem);
    }
}

// GPUs are told apart by UUID, not by device number: with
// CUDA_VISIBLE_DEVICES (here its emulated twin) each process numbers the
// GPUs it sees from 0. Rank 0 sees GPUs 1 and 0 and uses GPU 0 (its device
// 1), rank 1 sees GPU 0 alone (its device 0), rank 2 sees both and uses GPU
// 1 (its device 1): ranks 0 and 1 share a GPU, ranks 0 and 2 have peer
// access, and rank 1 cannot see rank 2's GPU, so their FIFOs are staged.
TEST_P(DeviceTest, RanksShareAGpuByItsUuidWhateverItsNumberInEachProcess) {
  if (std::string(GetParam()) != "emulated")
    GTEST_SKIP() << "the GPUs a process sees are set here through the emulated device's "
                    "BRAID_EMULATED_VISIBLE_DEVICES; CUDA_VISIBLE_DEVICES cannot change once "
                    "the test's process started CUDA";
  RunOptions run = options();
  run.enter = [](int rank) {
    const char* visible[] = {"1,0", "0", "0,1"};
    const int device[] = {1, 0, 1};
    ::setenv("BRAID_EMULATED_VISIBLE_DEVICES", visible[rank], 1);
    device::select("emulated");
    device::current()->setCurrent(device[rank]);
  };
  runRanks(
      3,
      [](Communicator& comm) {
        const char* expected[3][3] = {
            {"self", "cuda_ipc: same device", "cuda_ipc: peer access"},
            {"cuda_ipc: same device", "self", "cuda_ipc: staged through host memory"},
            {"cuda_ipc: peer access", "cuda_ipc: staged through host memory", "self"},
        };
        const std::vector<std::string> paths = braid::detail::peerDevicePaths(comm);
        for (int peer = 0; peer < comm.size(); ++peer)
          require(paths[peer] == expected[comm.rank()][peer],
                  format("rank %d reaches rank %d by '%s', not '%s'", comm.rank(), peer,
                         paths[peer].c_str(), expected[comm.rank()][peer]));
        requireEveryCollectiveMatches(comm, DataType::Float32, /*inPlace=*/false, 23);
      },
      run);
}

// A GPU whose memory no other process can map (no cuMem POSIX-fd handles,
// as on some virtual machines; BRAID_EMULATED_FD_HANDLES=0 here): the
// communicator still comes up, its FIFOs to other processes staged through
// host memory, and every collective matches.
TEST_P(DeviceTest, DevicesWithoutExportableMemoryStageThroughHostMemory) {
  if (std::string(GetParam()) != "emulated")
    GTEST_SKIP() << "a GPU without POSIX-fd handles is posed by the emulated device "
                    "(BRAID_EMULATED_FD_HANDLES=0)";
  ::setenv("BRAID_EMULATED_FD_HANDLES", "0", 1);
  runRanks(
      3,
      [](Communicator& comm) {
        device::Device& device = device::require("the test");
        require(!device.properties(deviceOf(comm)).fdHandles, "the device exports its memory");
        void* memory = device.allocate(deviceOf(comm), 4096);
        bool refused = false;
        try {
          ::close(device.exportFd(memory));
        } catch (const Error& error) {
          refused = std::string(error.what()).find("POSIX-fd") != std::string::npos;
        }
        device.free(memory);
        require(refused, "exportFd did not refuse device memory, naming POSIX-fd handles");
        const std::vector<std::string> paths = braid::detail::peerDevicePaths(comm);
        for (int peer = 0; peer < comm.size(); ++peer)
          if (peer != comm.rank())
            require(paths[peer] == "cuda_ipc: staged through host memory",
                    format("rank %d is reached by '%s'", peer, paths[peer].c_str()));
        requireEveryCollectiveMatches(comm, DataType::Int32, /*inPlace=*/true, 31);
      },
      options());
  ::unsetenv("BRAID_EMULATED_FD_HANDLES");
}

// ---- Send and receive.

TEST_P(DeviceTest, GroupedSendsAndReceivesToEveryPeerAt3Ranks) {
  runRanks(
      3,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank(), dev = deviceOf(comm);
        TestStream stream(dev);
        // From each rank to each rank (itself too), 2^17 + peer elements.
        auto countFor = [](int from, int to) { return (size_t{1} << 17) + 31 * from + to; };
        std::vector<std::unique_ptr<DeviceBuffer>> out, in;
        comm.groupStart();
        for (int peer = 0; peer < n; ++peer) {
          std::vector<int32_t> values(countFor(r, peer));
          for (size_t i = 0; i < values.size(); ++i)
            values[i] = static_cast<int32_t>(r * 1000003 + peer * 7919 + i);
          out.push_back(std::make_unique<DeviceBuffer>(dev, values.size() * 4));
          out.back()->upload(values.data());
          in.push_back(std::make_unique<DeviceBuffer>(dev, countFor(peer, r) * 4));
          comm.send(out.back()->data(), values.size(), DataType::Int32, peer, stream.stream());
          comm.recv(in.back()->data(), countFor(peer, r), DataType::Int32, peer, stream.stream());
        }
        comm.groupEnd();
        stream.synchronize();
        for (int peer = 0; peer < n; ++peer) {
          const std::vector<std::byte> got = in[peer]->download();
          const auto* values = reinterpret_cast<const int32_t*>(got.data());
          for (size_t i = 0; i < countFor(peer, r); ++i)
            require(values[i] == static_cast<int32_t>(peer * 1000003 + r * 7919 + i),
                    format("element %zu from rank %d is %d", i, peer, values[i]));
        }
      },
      options());
}

// Groups whose ranks receive before they send (to a peer, around a ring,
// and from themselves): the host executor runs them, so must the device.
TEST_P(DeviceTest, GroupsThatReceiveBeforeTheySendDoNotDeadlock) {
  for (int nranks : {1, 2, 3})
    runRanks(
        nranks,
        [](Communicator& comm) {
          const int n = comm.size(), r = comm.rank(), dev = deviceOf(comm);
          TestStream stream(dev);
          const size_t count = (size_t{1} << 18) + 5;  // many slots: beyond one FIFO
          std::vector<int32_t> mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(r * 1000003 + i);
          DeviceBuffer out(dev, count * 4), fromPrev(dev, count * 4), fromSelf(dev, count * 4);
          out.upload(mine.data());
          const int next = (r + 1) % n, prev = (r + n - 1) % n;
          comm.groupStart();
          comm.recv(fromPrev.data(), count, DataType::Int32, prev, stream.stream());
          comm.recv(fromSelf.data(), count, DataType::Int32, r, stream.stream());
          comm.send(out.data(), count, DataType::Int32, next, stream.stream());
          comm.send(out.data(), count, DataType::Int32, r, stream.stream());
          comm.groupEnd();
          stream.synchronize();
          for (auto [buffer, from] : {std::pair{&fromPrev, prev}, std::pair{&fromSelf, r}}) {
            const std::vector<std::byte> got = buffer->download();
            const auto* values = reinterpret_cast<const int32_t*>(got.data());
            for (size_t i = 0; i < count; i += 4099)
              require(values[i] == static_cast<int32_t>(from * 1000003 + i),
                      format("element %zu from rank %d is %d", i, from, values[i]));
          }
        },
        options());
}

// More one-piece sends to one peer than its FIFO has slots, grouped with
// receives from both sides: every rank's k-th message on a connection goes
// out in the same turn, so no send waits for a receive queued behind it.
TEST_P(DeviceTest, ManySmallGroupedSendsToOnePeerDoNotDeadlock) {
  runRanks(
      3,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank(), dev = deviceOf(comm);
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        TestStream stream(dev);
        constexpr int kMany = 9;  // more than the 4 slots
        const size_t count = 1000;
        std::vector<std::unique_ptr<DeviceBuffer>> out, in;
        for (int k = 0; k <= kMany; ++k) {
          std::vector<int32_t> values(count, r * 100 + k);
          out.push_back(std::make_unique<DeviceBuffer>(dev, count * 4));
          out.back()->upload(values.data());
          in.push_back(std::make_unique<DeviceBuffer>(dev, count * 4));
        }
        comm.groupStart();
        for (int k = 0; k < kMany; ++k)
          comm.send(out[k]->data(), count, DataType::Int32, next, stream.stream());
        comm.send(out[kMany]->data(), count, DataType::Int32, prev, stream.stream());
        comm.recv(in[kMany]->data(), count, DataType::Int32, next, stream.stream());
        for (int k = 0; k < kMany; ++k)
          comm.recv(in[k]->data(), count, DataType::Int32, prev, stream.stream());
        comm.groupEnd();
        stream.synchronize();
        for (int k = 0; k <= kMany; ++k) {
          const int from = k == kMany ? next : prev;
          const std::vector<std::byte> got = in[k]->download();
          const auto* values = reinterpret_cast<const int32_t*>(got.data());
          require(values[0] == from * 100 + k && values[count - 1] == from * 100 + k,
                  format("message %d from rank %d holds %d", k, from, values[0]));
        }
      },
      options());
}

// Ranks that group differently (a collective grouped with a send on one,
// alone after the matching receive on the other) do not mix up the data:
// the receive never takes the collective's message, and the op fails,
// saying the ranks did not issue the same operations.
TEST_P(DeviceTest, RanksThatGroupDifferentlyFailInsteadOfMixingData) {
  ::setenv("BRAID_TIMEOUT", "1", 1);
  RunOptions run = options();
  run.deadline = std::chrono::seconds(30);
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 4096;
        DeviceBuffer reduced(dev, count * 4), p2p(dev, count * 4);
        std::string problem;
        try {
          if (comm.rank() == 0) {
            comm.groupStart();
            comm.send(p2p.data(), count, DataType::Int32, 1, stream.stream());
            comm.allReduce(reduced.data(), reduced.data(), count, DataType::Int32, ReduceOp::Sum,
                           stream.stream());
            comm.groupEnd();
          } else {
            comm.recv(p2p.data(), count, DataType::Int32, 0, stream.stream());
            comm.allReduce(reduced.data(), reduced.data(), count, DataType::Int32, ReduceOp::Sum,
                           stream.stream());
          }
          stream.synchronize();
          comm.barrier();  // fails once the device op failed
          problem = "the mismatched ops completed";
        } catch (const Error& error) {
          if (comm.rank() == 1 &&
              std::string(error.what()).find("did not issue the same operations") ==
                  std::string::npos)
            problem = std::string("rank 1's error does not name the mismatch: ") + error.what();
        }
        stream.synchronize();
        require(problem.empty(), problem);
      },
      run);
  ::unsetenv("BRAID_TIMEOUT");
}

// A group that holds a collective and sends, issued in different orders on
// different ranks (NCCL allows it): both come out right.
TEST_P(DeviceTest, AGroupOfACollectiveAndSendsMayBeIssuedInAnyOrder) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int r = comm.rank(), dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 70001;
        std::vector<int32_t> values(count, r + 1);
        DeviceBuffer reduced(dev, count * 4), p2p(dev, count * 4);
        reduced.upload(values.data());
        std::vector<int32_t> tagged(count, 100 + r);
        p2p.upload(tagged.data());
        comm.groupStart();
        if (r == 0) {
          comm.send(p2p.data(), count, DataType::Int32, 1, stream.stream());
          comm.allReduce(reduced.data(), reduced.data(), count, DataType::Int32, ReduceOp::Sum,
                         stream.stream());
        } else {
          comm.allReduce(reduced.data(), reduced.data(), count, DataType::Int32, ReduceOp::Sum,
                         stream.stream());
          comm.recv(p2p.data(), count, DataType::Int32, 0, stream.stream());
        }
        comm.groupEnd();
        stream.synchronize();
        const std::vector<std::byte> sum = reduced.download(), got = p2p.download();
        const auto* sums = reinterpret_cast<const int32_t*>(sum.data());
        const auto* received = reinterpret_cast<const int32_t*>(got.data());
        for (size_t i = 0; i < count; i += 997) {
          require(sums[i] == 3, format("all-reduce element %zu is %d, not 3", i, sums[i]));
          require(received[i] == 100,
                  format("element %zu is %d, not rank 0's 100", i, received[i]));
        }
      },
      options());
}

// Grouped collectives whose ranks talk to different peers, one of them
// spanning several slots (from a trial of the chaos campaign): a rank
// that must hold back a piece of one where its peer need not does not
// leave both waiting for each other.
TEST_P(DeviceTest, GroupedCollectivesOnDifferentPeersDoNotDeadlockAt5Ranks) {
  ::setenv("BRAID_TIMEOUT", "20", 1);
  runRanks(
      5,
      [](Communicator& comm) {
        TestStream stream(deviceOf(comm));
        const std::vector<Case> cases = {
            {Coll::ReduceScatter, DataType::Int32, ReduceOp::Min, 26, true, 0},
            {Coll::Broadcast, DataType::Float32, ReduceOp::Sum, 51970, true, 4},
            {Coll::AllReduce, DataType::Float32, ReduceOp::Min, 360, true, 0},
            {Coll::Reduce, DataType::BFloat16, ReduceOp::Max, 173533, false, 3},
            {Coll::AllGather, DataType::Int64, ReduceOp::Sum, 2094, true, 0}};
        std::vector<std::unique_ptr<IssuedCase>> issued;
        comm.groupStart();
        uint64_t seed = 0;
        for (const Case& c : cases)
          issued.push_back(std::make_unique<IssuedCase>(comm, stream, c, ++seed));
        comm.groupEnd();
        stream.synchronize();
        for (auto& one : issued) {
          const std::string problem = one->check();
          require(problem.empty(), problem);
        }
      },
      options());
  ::unsetenv("BRAID_TIMEOUT");
}

// ---- Stream semantics.

// The call only enqueues: with the stream held, the op has not run; once
// released, it completes and Work follows it.
TEST_P(DeviceTest, TheCallReturnsBeforeTheOpRunsAndWorkFollowsTheStream) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        StreamHold hold(dev);
        const size_t count = 4099;
        std::vector<float> ones(count, 1.0f), zeros(count, 0.0f);
        DeviceBuffer send(dev, count * 4), recv(dev, count * 4);
        send.upload(ones.data());
        recv.upload(zeros.data());
        hold.hold(stream);
        Work work = comm.allReduce(send.data(), recv.data(), count, DataType::Float32,
                                   ReduceOp::Sum, stream.stream());
        std::this_thread::sleep_for(milliseconds(100));
        require(!work.test(), "the op completed while its stream was held");
        const std::vector<std::byte> early = recv.download();
        require(reinterpret_cast<const float*>(early.data())[0] == 0.0f,
                "the output changed while the stream was held");
        hold.release();
        work.wait();
        require(work.test(), "Work::test() is false after wait()");
        const std::vector<std::byte> late = recv.download();
        const auto* values = reinterpret_cast<const float*>(late.data());
        for (size_t i = 0; i < count; ++i)
          require(values[i] == 2.0f, format("element %zu is %g, not 2", i, values[i]));
      },
      options());
}

// Issuing never waits for the device: not even a group that needs more
// scratch memory than the ops still queued on a held stream use.
TEST_P(DeviceTest, IssuingNeverWaitsForTheStreamEvenWhenScratchGrows) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        StreamHold hold(dev);
        const size_t count = 1000;
        std::vector<float> ones(count, 1.0f);
        DeviceBuffer a(dev, count * 4), b(dev, count * 4), c(dev, count * 4);
        for (DeviceBuffer* buffer : {&a, &b, &c}) buffer->upload(ones.data());
        hold.hold(stream);
        comm.allReduce(a.data(), a.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        const auto start = steady_clock::now();
        comm.groupStart();
        comm.allReduce(b.data(), b.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        comm.allReduce(c.data(), c.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        comm.groupEnd();
        require(steady_clock::now() - start < milliseconds(500),
                "groupEnd waited for the held stream");
        hold.release();
        stream.synchronize();
        for (DeviceBuffer* buffer : {&a, &b, &c}) {
          const std::vector<std::byte> got = buffer->download();
          require(reinterpret_cast<const float*>(got.data())[count - 1] == 2.0f, "wrong result");
        }
      },
      options());
}

// Ops queued on one stream run in order, each after the stream's earlier
// work: here a device copy fills the input of the first of a chain of
// all-reduces, each of which reads the previous one's output.
TEST_P(DeviceTest, OpsRunInStreamOrderAfterEarlierWorkOnTheStream) {
  runRanks(
      3,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        StreamHold hold(dev);
        const size_t count = 70001;
        std::vector<int32_t> start(count);
        for (size_t i = 0; i < count; ++i) start[i] = static_cast<int32_t>(i % 97);
        DeviceBuffer staged(dev, count * 4), a(dev, count * 4), b(dev, count * 4);
        staged.upload(start.data());
        hold.hold(stream);
        device::current()->copy(stream.handle(), a.data(), staged.data(), count * 4);
        constexpr int kChain = 5;
        for (int k = 0; k < kChain; ++k) {
          DeviceBuffer& from = k % 2 == 0 ? a : b;
          DeviceBuffer& to = k % 2 == 0 ? b : a;
          comm.allReduce(from.data(), to.data(), count, DataType::Int32, ReduceOp::Sum,
                         stream.stream());
        }
        hold.release();
        stream.synchronize();
        const std::vector<std::byte> got = (kChain % 2 == 1 ? b : a).download();
        const auto* values = reinterpret_cast<const int32_t*>(got.data());
        int32_t factor = 1;
        for (int k = 0; k < kChain; ++k) factor *= comm.size();
        for (size_t i = 0; i < count; ++i)
          require(values[i] == start[i] * factor,
                  format("element %zu is %d, not %d", i, values[i], start[i] * factor));
      },
      options());
}

// Ops issued on different streams still run in issue order: the second
// waits for the first, whose stream is held.
TEST_P(DeviceTest, OpsOnDifferentStreamsRunInIssueOrder) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream first(dev), second(dev);
        StreamHold hold(dev);
        const size_t count = 1 << 16;
        std::vector<float> ones(count, 1.0f);
        DeviceBuffer x(dev, count * 4), y(dev, count * 4);
        x.upload(ones.data());
        y.upload(ones.data());
        hold.hold(first);
        Work one = comm.allReduce(x.data(), x.data(), count, DataType::Float32, ReduceOp::Sum,
                                  first.stream());
        Work two = comm.allReduce(y.data(), y.data(), count, DataType::Float32, ReduceOp::Sum,
                                  second.stream());
        std::this_thread::sleep_for(milliseconds(100));
        require(!one.test() && !two.test(), "an op ran while the first stream was held");
        hold.release();
        two.wait();
        one.wait();
        for (DeviceBuffer* buffer : {&x, &y}) {
          const std::vector<std::byte> got = buffer->download();
          const auto* values = reinterpret_cast<const float*>(got.data());
          require(values[0] == 2.0f && values[count - 1] == 2.0f, "wrong result");
        }
      },
      options());
}

// ---- Bad arguments: InvalidArgument naming the argument; the
// communicator stays usable.

void requireInvalid(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
  } catch (const Error& error) {
    require(error.code() == ErrorCode::InvalidArgument,
            std::string("expected InvalidArgument: ") + error.what());
    require(std::string(error.what()).find(needle) != std::string::npos,
            "message '" + std::string(error.what()) + "' does not mention '" + needle + "'");
    return;
  }
  throw RankFailure{"expected an error mentioning '" + needle + "', got none"};
}

TEST_P(DeviceTest, AReductionRefusesHostMemoryAKernelCannotTouchAndTakesPageLockedMemory) {
  runRanks(
      1,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        device::Device& device = device::require("the test");
        TestStream stream(dev);
        const size_t count = 1024;
        DeviceBuffer out(dev, count * sizeof(float));
        std::vector<float> pageable(count, 2.0f);  // ordinary host memory
        auto* locked = static_cast<float*>(device.allocateHost(count * sizeof(float)));
        std::fill(locked, locked + count, 3.0f);
        device::ReduceArgs args;
        args.dst = out.data();
        args.inputs = 2;
        args.count = count;
        args.srcs[0] = locked;
        args.srcs[1] = pageable.data();
        requireInvalid([&] { device.reduce(stream.handle(), args); }, "not page-locked");
        args.srcs[1] = locked;
        args.dst = pageable.data();
        requireInvalid([&] { device.reduce(stream.handle(), args); }, "not page-locked");
        // Page-locked host memory is taken, as input and as output.
        args.dst = out.data();
        device.reduce(stream.handle(), args);
        args.srcs[1] = out.data();
        args.dst = locked;
        device.reduce(stream.handle(), args);
        stream.synchronize();
        require(locked[count - 1] == 9.0f, format("3 + (3 + 3) came out as %g", locked[count - 1]));
        device.free(locked);
      },
      options());
}

// More streams blocked in flag waits than a GPU has hardware queues (8
// unless CUDA_DEVICE_MAX_CONNECTIONS says otherwise): the host-side calls
// the watchdog relies on still return within their deadline, answering or
// failing, and a host write into a flag in page-locked host memory, a
// store, releases every wait.
TEST_P(DeviceTest, HostSideCallsKeepTheirDeadlineWhileManyStreamsWaitOnFlags) {
  runRanks(
      1,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        device::Device& device = device::require("the test");
        constexpr int kStreams = 12;
        auto* flag = static_cast<uint32_t*>(device.allocateHost(sizeof(uint32_t)));
        std::vector<std::unique_ptr<TestStream>> streams;
        for (int i = 0; i < kStreams; ++i) {
          streams.push_back(std::make_unique<TestStream>(dev));
          const device::FlagOp wait = device::FlagOp::wait(flag, 1);
          device.flagOps(streams.back()->handle(), &wait, 1);
        }
        DeviceBuffer memory(dev, size_t{1} << 20);
        std::vector<std::byte> pageable(size_t{1} << 20, std::byte{7});
        // Each either answers or throws naming the queues, well within 15 s.
        auto bounded = [](const char* what, const std::function<void()>& call) {
          const auto start = std::chrono::steady_clock::now();
          try {
            call();
          } catch (const Error& error) {
            require(
                std::string(error.what()).find("CUDA_DEVICE_MAX_CONNECTIONS") != std::string::npos,
                format("%s failed: %s", what, error.what()));
          }
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          require(seconds < 15, format("%s took %.1f s", what, seconds));
        };
        bounded("copyNow into device memory",
                [&] { device.copyNow(memory.data(), pageable.data(), pageable.size()); });
        bounded("copyNow into pageable memory",
                [&] { device.copyNow(pageable.data(), memory.data(), pageable.size()); });
        bounded("readFlagNow", [&] {
          require(device.readFlagNow(reinterpret_cast<uint32_t*>(memory.data())) == 0x07070707u,
                  "readFlagNow read another value");
        });
        device.writeFlagNow(flag, 1);
        for (auto& stream : streams) stream->synchronize();
        device.free(flag);
      },
      options());
}

TEST_P(DeviceTest, MixedOrForeignBuffersAndHostStreamsAreRejectedNamingTheArgument) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 1024;
        DeviceBuffer onDevice(dev, count * 4);
        std::vector<float> onHost(count, 1.0f);
        requireInvalid(
            [&] {
              comm.allReduce(onHost.data(), onDevice.data(), count, DataType::Float32,
                             ReduceOp::Sum, stream.stream());
            },
            "argument 'send' is host memory and 'recv' device memory");
        requireInvalid(
            [&] {
              comm.allReduce(onDevice.data(), onDevice.data(), count, DataType::Float32,
                             ReduceOp::Sum);
            },
            "argument 'stream'");
        if (device::current()->count() > 1) {
          DeviceBuffer other(dev + 1, count * 4);
          requireInvalid(
              [&] {
                comm.allReduce(other.data(), onDevice.data(), count, DataType::Float32,
                               ReduceOp::Sum, stream.stream());
              },
              format("argument 'send' is memory of device %d", dev + 1));
        }
        // Still usable, on the device and on the host.
        std::vector<float> ones(count, 1.0f);
        onDevice.upload(ones.data());
        comm.allReduce(onDevice.data(), onDevice.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        stream.synchronize();
        const std::vector<std::byte> got = onDevice.download();
        require(reinterpret_cast<const float*>(got.data())[count - 1] == 2.0f,
                "the device all-reduce after the rejections is wrong");
        comm.allReduce(onHost.data(), onHost.data(), count, DataType::Float32, ReduceOp::Sum);
        require(onHost[0] == 2.0f, "the host all-reduce after the rejections is wrong");
      },
      options());
}

// ---- Faults.

// kill -9 a rank at random moments of a loop of device all-reduces: every
// survivor's op fails naming the dead rank within 2 s of the death, its
// stream does not stay blocked, and later ops fail at once.
TEST_P(DeviceTest, AKilledPeerFailsEverySurvivorWithinTwoSecondsAndNoStreamStaysBlocked) {
  constexpr int kRanks = 4;
  struct Death {
    std::atomic<int64_t> at;
  };
  SharedWithRanks<Death> death;
  std::atomic<int64_t>* diedAt = &death->at;
  auto nowNs = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               steady_clock::now().time_since_epoch())
        .count();
  };
  std::mt19937 moments(20261201);
  for (int moment = 0; moment < 8; ++moment) {
    const int victim = static_cast<int>(moments() % kRanks);
    const auto delay = std::chrono::microseconds(moments() % 40000);
    diedAt->store(0);
    RunOptions run = options();
    run.killed = {victim};
    run.deadline = std::chrono::seconds(30);
    runRanks(
        kRanks,
        [&](Communicator& comm) {
          const int dev = deviceOf(comm);
          TestStream stream(dev);
          const size_t count = 1 << 15;
          std::vector<float> values(count);
          DeviceBuffer in(dev, count * 4), out(dev, count * 4);
          comm.barrier();
          if (comm.rank() == victim)
            std::thread([&] {
              std::this_thread::sleep_for(delay);
              diedAt->store(nowNs());
              ::kill(::getpid(), SIGKILL);
            }).detach();
          // Every op that reports success must have the right result: a
          // failing peer's released stream must not pass off stale data.
          try {
            for (int i = 0;; ++i) {
              std::fill(values.begin(), values.end(), static_cast<float>(8 * i + comm.rank()));
              in.upload(values.data());
              comm.allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum,
                             stream.stream())
                  .wait();
              const std::vector<std::byte> got = out.download();
              const auto* sums = reinterpret_cast<const float*>(got.data());
              const float expected = static_cast<float>(8 * i * kRanks + kRanks * (kRanks - 1) / 2);
              for (size_t j = 0; j < count; j += 1021)
                require(sums[j] == expected,
                        format("moment %d, op %d succeeded with element %zu = %g, not %g", moment,
                               i, j, sums[j], expected));
            }
          } catch (const Error& error) {
            const int64_t failedAt = nowNs(), died = diedAt->load();
            const std::string what = error.what();
            require(error.code() == ErrorCode::RemoteError, "expected RemoteError: " + what);
            require(what.find(format("peer %d ", victim)) != std::string::npos ||
                        what.find(format("rank %d failed", victim)) != std::string::npos,
                    format("moment %d: the error does not name rank %d: ", moment, victim) + what);
            require(died > 0 && failedAt - died < 2'000'000'000,
                    format("moment %d: failed %.3f s after the death", moment,
                           (failedAt - died) / 1e9));
            const auto before = steady_clock::now();
            stream.synchronize();
            require(steady_clock::now() - before < std::chrono::seconds(2),
                    "the stream stayed blocked after the op failed");
            try {
              comm.allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum,
                             stream.stream());
              throw RankFailure{"an op after the failure was accepted"};
            } catch (const Error& later) {
              require(later.code() == ErrorCode::RemoteError,
                      std::string("the next op failed otherwise: ") + later.what());
            }
          }
        },
        run);
    if (::testing::Test::HasFailure()) break;
  }
}

// A rank revokes while the others' device all-reduce waits for it: their
// ops fail with Revoked naming it, and their streams run on.
TEST_P(DeviceTest, ARevokeFailsThePeersDeviceOpsNamingTheRankAndReleasesTheirStreams) {
  runRanks(
      3,
      [&](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        DeviceBuffer in(dev, 4096), out(dev, 4096);
        comm.barrier();
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(milliseconds(200));
          comm.revoke();
          return;
        }
        Work work = comm.allReduce(in.data(), out.data(), 1024, DataType::Float32, ReduceOp::Sum,
                                   stream.stream());
        try {
          work.wait();
          require(false, "the all-reduce completed without rank 2");
        } catch (const Error& error) {
          const std::string what = error.what();
          require(error.code() == ErrorCode::Revoked, "expected Revoked: " + what);
          require(what.find("rank 2 revoked") != std::string::npos,
                  "the error does not name rank 2: " + what);
        }
        const auto before = steady_clock::now();
        stream.synchronize();
        require(steady_clock::now() - before < std::chrono::seconds(2),
                "the stream stayed blocked after the revoke");
      },
      options());
}

// Survivors with device ops queued behind a dead rank: shrink with Abort
// fails them and releases their streams, and the shrunk communicator runs
// device collectives right at the new size.
TEST_P(DeviceTest, SurvivorsShrinkWithOpsQueuedBehindADeadRankAndGoOnOnDeviceBuffers) {
  constexpr int kRanks = 4, kVictim = 2;
  RunOptions run = options();
  run.killed = {kVictim};
  run.deadline = std::chrono::seconds(60);
  runRanks(
      kRanks,
      [&](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 1 << 14;
        std::vector<float> values(count, static_cast<float>(comm.rank() + 1));
        DeviceBuffer in(dev, count * 4), out(dev, count * 4);
        in.upload(values.data());
        comm.barrier();
        if (comm.rank() == kVictim) {
          std::this_thread::sleep_for(milliseconds(100));
          ::raise(SIGKILL);
        }
        std::vector<Work> queued;
        try {
          for (int i = 0; i < 40; ++i)
            queued.push_back(comm.allReduce(in.data(), out.data(), count, DataType::Float32,
                                            ReduceOp::Sum, stream.stream()));
        } catch (const Error&) {  // the death was seen while enqueueing
        }
        std::this_thread::sleep_for(milliseconds(300));
        Communicator shrunk = comm.shrink({kVictim}, ShrinkFlags::Abort);
        const auto before = steady_clock::now();
        stream.synchronize();
        require(steady_clock::now() - before < std::chrono::seconds(2),
                "the stream stayed blocked after the shrink");
        require(shrunk.size() == kRanks - 1 && shrunk.device() == dev, "the shrunk communicator");
        std::fill(values.begin(), values.end(), static_cast<float>(shrunk.rank() + 1));
        in.upload(values.data());
        shrunk
            .allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream())
            .wait();
        const std::vector<std::byte> got = out.download();
        const auto* sums = reinterpret_cast<const float*>(got.data());
        for (size_t j = 0; j < count; j += 997)
          require(sums[j] == 6.0f, format("element %zu is %g after the shrink, not 6", j, sums[j]));
      },
      run);
}

// A rank that never issues the op, whatever the all-reduce algorithm: the
// others time out within the timeout and its grace, each naming it, not a
// peer that waits for it too and so owes data as well; and their streams
// run on.
TEST_P(DeviceTest, AMissingRankMakesTheOthersTimeOutNamingItWhateverTheAlgorithm) {
  constexpr int kRanks = 4;
  ::setenv("BRAID_TIMEOUT", "1", 1);
  for (const char* algo : {"ring", "tree", "rabenseifner", "recdoubling"})
    for (int late : {1, kRanks - 1}) {
      SCOPED_TRACE(format("%s, rank %d late", algo, late));
      ::setenv("BRAID_ALGO", format("allreduce:%s", algo).c_str(), 1);
      RunOptions run = options();
      run.deadline = std::chrono::seconds(30);
      runRanks(
          kRanks,
          [&](Communicator& comm) {
            const int dev = deviceOf(comm);
            TestStream stream(dev);
            const size_t count = (1 << 17) + 5;  // 9 slots
            DeviceBuffer buffer(dev, count * 4);
            if (comm.rank() == late) {
              std::this_thread::sleep_for(milliseconds(3000));
              return;
            }
            const auto start = steady_clock::now();
            try {
              comm.allReduce(buffer.data(), buffer.data(), count, DataType::Float32, ReduceOp::Sum,
                             stream.stream())
                  .wait();
              throw RankFailure{"the op completed without the late rank"};
            } catch (const Error& error) {
              const std::string what = error.what();
              const auto took =
                  std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
              require(error.code() == ErrorCode::Timeout, "expected Timeout: " + what);
              require(took < milliseconds(2500),
                      format("failed after %lld ms", static_cast<long long>(took.count())));
              const std::regex names(
                  format("rank %d stopped answering|from rank %d \\(|for rank %d to take data",
                         late, late, late));
              require(std::regex_search(what, names),
                      "the error does not name the late rank: " + what);
            }
            stream.synchronize();
          },
          run);
    }
  ::unsetenv("BRAID_TIMEOUT");
  ::unsetenv("BRAID_ALGO");
}

// A failure seen only on the device path (rank 1's receive from a silent
// rank 2 times out) reaches a peer that waits for rank 1 on host buffers
// once rank 1 destroys its communicator: the peer fails naming rank 2, not
// rank 1 as if it had left cleanly.
TEST_P(DeviceTest, AFailureOnTheDevicePathReachesPeersWaitingOnHostBuffers) {
  ::setenv("BRAID_TIMEOUT", "1", 1);
  RunOptions run = options();
  run.deadline = std::chrono::seconds(30);
  runRanks(
      3,
      [&](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        if (comm.rank() == 2) {  // silent
          std::this_thread::sleep_for(milliseconds(4000));
          return;
        }
        if (comm.rank() == 1) {
          DeviceBuffer buffer(dev, 4096);
          try {
            comm.recv(buffer.data(), 1024, DataType::Int32, 2, stream.stream()).wait();
            throw RankFailure{"the device receive completed"};
          } catch (const Error& error) {
            require(error.code() == ErrorCode::Timeout &&
                        std::string(error.what()).find("rank 2") != std::string::npos,
                    std::string("expected a Timeout naming rank 2: ") + error.what());
          }
          stream.synchronize();
          return;  // destroys the communicator: no host op saw the failure
        }
        // Rank 0 waits for rank 1 on host buffers, its deadline well after
        // rank 1's failure.
        std::this_thread::sleep_for(milliseconds(1000));
        std::vector<int32_t> data(16);
        try {
          comm.recv(data.data(), data.size(), DataType::Int32, 1);
          throw RankFailure{"the receive completed"};
        } catch (const Error& error) {
          require(std::string(error.what()).find("rank 2") != std::string::npos,
                  std::string("the error does not name rank 2: ") + error.what());
        }
      },
      run);
  ::unsetenv("BRAID_TIMEOUT");
}

// SIGUSR1 while a device op's stream waits: the report reads the counters
// and says which op the stream is stuck in and what for (here, rank 1's
// data, which comes a second late). Whatever the host side is doing: it
// returned as soon as the op was on the stream.
TEST_P(DeviceTest, AHangReportSaysWhereTheStreamIsStuck) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 1 << 12;
        DeviceBuffer buffer(dev, count * 4);
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(1000));
          comm.send(buffer.data(), count, DataType::Float32, 0, stream.stream());
          stream.synchronize();
          return;
        }
        const std::string report = captureStderr([&] {
          comm.recv(buffer.data(), count, DataType::Float32, 1, stream.stream());
          std::this_thread::sleep_for(milliseconds(300));
          ::raise(SIGUSR1);
          std::this_thread::sleep_for(milliseconds(300));  // the report thread has written
          stream.synchronize();
        });
        for (const char* expected : {"hang report (SIGUSR1): rank 0 of 2",
                                     "on the device: 1 op(s) enqueued and not passed",
                                     "the oldest, recv #0 (count 4096, float32, peer 1), reached",
                                     "waiting for data from rank 1 (1 messages still to come)"})
          require(report.find(expected) != std::string::npos,
                  format("no '%s' in the report: %s", expected, report.c_str()));
      },
      options());
}

// abort() from another thread fails an op that waits for a peer that is
// not coming, and the stream runs on; the late peer then fails naming the
// rank that gave up.
TEST_P(DeviceTest, AbortFromAnotherThreadFailsAWaitingOpAndReleasesItsStream) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 1 << 12;
        DeviceBuffer buffer(dev, count * 4);
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(1500));
          try {
            for (int i = 0; i < 2; ++i)
              comm.allReduce(buffer.data(), buffer.data(), count, DataType::Float32, ReduceOp::Sum,
                             stream.stream())
                  .wait();
            throw RankFailure{"rank 1's ops completed after rank 0 aborted"};
          } catch (const Error& error) {
            require(error.code() == ErrorCode::RemoteError,
                    std::string("expected RemoteError: ") + error.what());
            require(std::string(error.what()).find("peer 0") != std::string::npos,
                    std::string("the error does not name rank 0: ") + error.what());
          }
          stream.synchronize();
          return;
        }
        Work work = comm.allReduce(buffer.data(), buffer.data(), count, DataType::Float32,
                                   ReduceOp::Sum, stream.stream());
        std::thread aborter([&] {
          std::this_thread::sleep_for(milliseconds(300));
          comm.abort();
        });
        const auto start = steady_clock::now();
        try {
          work.wait();
          throw RankFailure{"the op completed without its peer"};
        } catch (const Error& error) {
          require(error.code() == ErrorCode::Aborted,
                  std::string("expected Aborted: ") + error.what());
        }
        aborter.join();
        require(steady_clock::now() - start < std::chrono::seconds(1),
                "the op failed more than a second after abort()");
        stream.synchronize();
      },
      options());
}

// A peer that destroys its communicator while this rank's op still waits
// for its data (it issued one op fewer): the op fails at once, not at the
// timeout, naming the peer.
TEST_P(DeviceTest, APeerThatLeavesWhileAnOpWaitsForItFailsTheOpAtOnce) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int dev = deviceOf(comm);
        TestStream stream(dev);
        const size_t count = 1 << 12;
        DeviceBuffer buffer(dev, count * 4);
        comm.allReduce(buffer.data(), buffer.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        stream.synchronize();
        if (comm.rank() == 1) return;  // leaves: its communicator is destroyed
        const auto start = steady_clock::now();
        try {
          comm.allReduce(buffer.data(), buffer.data(), count, DataType::Float32, ReduceOp::Sum,
                         stream.stream())
              .wait();
          throw RankFailure{"the op completed without its peer"};
        } catch (const Error& error) {
          require(error.code() == ErrorCode::RemoteError,
                  std::string("expected RemoteError: ") + error.what());
          require(std::string(error.what()).find("peer 1") != std::string::npos,
                  std::string("the error does not name rank 1: ") + error.what());
        }
        require(steady_clock::now() - start < std::chrono::seconds(2),
                "the op failed more than 2 s after its peer left");
        stream.synchronize();
      },
      options());
}

INSTANTIATE_TEST_SUITE_P(Device, DeviceTest, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace braid::testing
