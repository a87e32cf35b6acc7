// One process driving several devices (NCCL's single-process model):
// Communicator::initAll with 1 to 4 devices, repeats allowed; every
// collective issued by one thread on every rank in turn before it waits
// for any; sends and receives between the devices of the process, grouped
// per communicator; and the paths: nvlink_p2p between ranks of one
// process, cuda_ipc to ranks of another. Each test forks the processes it
// needs; it runs on the emulated device everywhere and on CUDA where a GPU
// is present (an instance whose device is missing skips, saying why).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/introspect.h"
#include "device_cases.h"
#include "device_support.h"
#include "multirank.h"
#include "reference.h"

namespace braid::testing {
namespace {

// A rank of this process and its stream.
struct Rank {
  Communicator comm;
  std::unique_ptr<TestStream> stream;
};

std::vector<Rank> initAll(const std::vector<int>& devices) {
  std::vector<Communicator> comms = Communicator::initAll(devices, RunOptions::loopbackConfig());
  require(comms.size() == devices.size(),
          format("initAll made %zu communicators for %zu devices", comms.size(), devices.size()));
  std::vector<Rank> ranks;
  for (size_t i = 0; i < comms.size(); ++i) {
    Communicator& comm = comms[i];
    require(comm.rank() == static_cast<int>(i) && comm.size() == static_cast<int>(devices.size()),
            format("communicator %zu is rank %d of %d", i, comm.rank(), comm.size()));
    require(comm.device() == devices[i],
            format("rank %zu is on device %d, not %d", i, comm.device(), devices[i]));
    ranks.push_back({std::move(comm), std::make_unique<TestStream>(devices[i])});
  }
  return ranks;
}

// The case on every rank, issued by this thread one rank after the other,
// then every stream synchronized and every result checked.
void runOnAll(std::vector<Rank>& ranks, const Case& c, uint64_t seed) {
  std::vector<std::unique_ptr<IssuedCase>> issued;
  for (Rank& rank : ranks)
    issued.push_back(std::make_unique<IssuedCase>(rank.comm, *rank.stream, c, seed));
  for (Rank& rank : ranks) rank.stream->synchronize();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string problem = issued[r]->check();
    require(problem.empty(), format("rank %zu: %s", r, problem.c_str()));
  }
}

// What rank `from` should say reaches rank `to` of the same process.
std::string inProcessPath(const std::vector<int>& devices, int from, int to, bool staged) {
  if (from == to) return "self";
  if (devices[from] == devices[to]) return "nvlink_p2p: same device";
  return staged ? "nvlink_p2p: staged through host memory" : "nvlink_p2p: peer access";
}

void requirePaths(std::vector<Rank>& ranks, const std::vector<int>& devices, bool staged) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<std::string> paths = braid::detail::peerDevicePaths(ranks[r].comm);
    for (size_t peer = 0; peer < ranks.size(); ++peer) {
      const std::string want =
          inProcessPath(devices, static_cast<int>(r), static_cast<int>(peer), staged);
      require(paths.at(peer) == want, format("rank %zu reaches rank %zu by '%s', not '%s'", r, peer,
                                             paths.at(peer).c_str(), want.c_str()));
    }
  }
}

class OneProcess : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << "no " << GetParam() << " device here: " << why;
    ::setenv("BRAID_DEVICE_SLOT_BYTES", "64K", 1);  // modest counts cross many slots
  }
  void TearDown() override { ::unsetenv("BRAID_DEVICE_SLOT_BYTES"); }

  bool emulated() const { return std::string(GetParam()) == "emulated"; }
  int devicesHere() const { return device::current()->count(); }

  // Runs `body` in `processes` forked processes that select this test's
  // device first; the id is theirs to use or not.
  void inProcesses(int processes, const std::function<void(int, const UniqueId&)>& body) {
    RunOptions options;
    const std::string backend = GetParam();
    options.enter = [backend](int) { device::select(backend); };
    runProcesses(
        processes, [&](int process, const UniqueId& id, const Config&) { body(process, id); },
        options);
  }
};

// The device lists of the sweep, each device taken modulo the devices this
// process has (one GPU stands for all of them).
std::vector<std::vector<int>> deviceLists(int available) {
  std::vector<std::vector<int>> lists = {{0}, {0, 1}, {0, 1, 2}, {0, 1, 0, 1}, {0, 1, 2, 3}};
  for (auto& list : lists)
    for (int& device : list) device %= available;
  return lists;
}

TEST_P(OneProcess, InitAllWithOneToFourDevicesRunsEveryCollective) {
  inProcesses(1, [&](int, const UniqueId&) {
    uint64_t seed = 1;
    for (const std::vector<int>& devices : deviceLists(devicesHere())) {
      std::vector<Rank> ranks = initAll(devices);
      requirePaths(ranks, devices, false);
      for (Coll coll : kAllColls)
        for (DataType type : {DataType::Int32, DataType::Float32, DataType::BFloat16})
          for (ReduceOp op : reduces(coll) ? std::vector<ReduceOp>{ReduceOp::Sum, ReduceOp::Avg}
                                           : std::vector<ReduceOp>{ReduceOp::Sum})
            for (size_t count : {size_t{0}, size_t{1}, size_t{1023}, (size_t{1} << 16) + 3})
              for (bool inPlace : {false, true})
                runOnAll(ranks,
                         {coll, type, op, count, inPlace,
                          static_cast<int>(seed % 2) % static_cast<int>(ranks.size())},
                         ++seed);
    }
  });
}

TEST_P(OneProcess, DevicesWithoutPeerAccessStageThroughHostMemory) {
  if (!emulated()) GTEST_SKIP() << "peer access can be turned off only on the emulated device";
  ::setenv("BRAID_EMULATED_PEER_ACCESS", "0", 1);
  inProcesses(1, [&](int, const UniqueId&) {
    const std::vector<int> devices = {0, 1, 1};
    std::vector<Rank> ranks = initAll(devices);
    requirePaths(ranks, devices, true);
    uint64_t seed = 5;
    for (Coll coll : kAllColls)
      for (size_t count : {size_t{7}, (size_t{1} << 16) + 3})
        runOnAll(ranks, {coll, DataType::Float32, ReduceOp::Max, count, true, 1}, ++seed);
  });
  ::unsetenv("BRAID_EMULATED_PEER_ACCESS");
}

// Every rank sends a different block to every other rank and receives one
// from each, grouped on each communicator; one thread ends every group in
// turn (nothing waits for the stream), then waits for all of them.
TEST_P(OneProcess, GroupedSendsAndReceivesBetweenTheDevicesOfOneThread) {
  inProcesses(1, [&](int, const UniqueId&) {
    const int available = devicesHere();
    const std::vector<int> devices = {0, 1 % available, 2 % available, 0};
    std::vector<Rank> ranks = initAll(devices);
    const int n = static_cast<int>(ranks.size());
    const size_t count = (size_t{1} << 15) + 5;  // several slots
    auto value = [](int from, int to, size_t i) {
      return static_cast<int32_t>(from * 1000003 + to * 7919 + static_cast<int>(i));
    };
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> out(n), in(n);
    for (int r = 0; r < n; ++r)
      for (int peer = 0; peer < n; ++peer) {
        std::vector<int32_t> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = value(r, peer, i);
        out[r].push_back(std::make_unique<DeviceBuffer>(devices[r], count * sizeof(int32_t)));
        out[r][peer]->upload(mine.data());
        in[r].push_back(std::make_unique<DeviceBuffer>(devices[r], count * sizeof(int32_t)));
        in[r][peer]->upload(poisoned(DataType::Int32, count));
      }
    std::vector<Work> works;
    for (int r = 0; r < n; ++r) {
      Communicator& comm = ranks[r].comm;
      const Stream stream = ranks[r].stream->stream();
      comm.groupStart();
      for (int step = 1; step < n; ++step) {  // receives first on odd ranks: any order works
        const int to = (r + step) % n, from = (r - step + n) % n;
        if (r % 2)
          works.push_back(comm.recv(in[r][from]->data(), count, DataType::Int32, from, stream));
        works.push_back(comm.send(out[r][to]->data(), count, DataType::Int32, to, stream));
        if (r % 2 == 0)
          works.push_back(comm.recv(in[r][from]->data(), count, DataType::Int32, from, stream));
      }
      comm.groupEnd();
    }
    for (Rank& rank : ranks) rank.stream->synchronize();
    for (Work& work : works) work.wait();
    for (int r = 0; r < n; ++r)
      for (int from = 0; from < n; ++from) {
        if (from == r) continue;
        const std::vector<std::byte> got = in[r][from]->download();
        const auto* values = reinterpret_cast<const int32_t*>(got.data());
        for (size_t i = 0; i < count; ++i)
          require(values[i] == value(from, r, i),
                  format("rank %d's element %zu from rank %d is %d, not %d", r, i, from, values[i],
                         value(from, r, i)));
      }
  });
}

// Two processes of two ranks each (one thread per rank): nvlink_p2p inside
// a process, cuda_ipc between the processes, and all-reduces right across.
TEST_P(OneProcess, RanksOfTwoProcessesMixNvlinkP2pAndCudaIpc) {
  inProcesses(2, [&](int process, const UniqueId& id) {
    constexpr int kRanks = 4;
    const int available = devicesHere();
    std::vector<Communicator> comms(2);
    std::vector<std::thread> threads;
    std::vector<std::string> failures(2);
    for (int local = 0; local < 2; ++local)
      threads.emplace_back([&, local] {
        try {
          Config config = RunOptions::loopbackConfig();
          config.device = local % available;
          comms[local] = Communicator::init(kRanks, process * 2 + local, id, config);
        } catch (const std::exception& error) {
          failures[local] = error.what();
        }
      });
    for (std::thread& thread : threads) thread.join();
    for (const std::string& failure : failures) require(failure.empty(), failure);
    std::vector<Rank> ranks;
    for (Communicator& comm : comms) {
      const int device = comm.device();
      ranks.push_back({std::move(comm), std::make_unique<TestStream>(device)});
    }
    for (Rank& rank : ranks) {
      const int me = rank.comm.rank();
      const std::vector<std::string> paths = braid::detail::peerDevicePaths(rank.comm);
      for (int peer = 0; peer < kRanks; ++peer) {
        const bool mine = peer / 2 == me / 2;
        const std::string way =
            peer == me ? "self"
            : mine     ? (available > 1 ? "nvlink_p2p: peer access" : "nvlink_p2p: same device")
                       : (peer % 2 == me % 2 || available == 1 ? "cuda_ipc: same device"
                                                               : "cuda_ipc: peer access");
        require(paths.at(peer) == way, format("rank %d reaches rank %d by '%s', not '%s'", me, peer,
                                              paths.at(peer).c_str(), way.c_str()));
      }
    }
    uint64_t seed = 40;
    for (Coll coll : kAllColls)
      for (size_t count : {size_t{3}, (size_t{1} << 16) + 1})
        runOnAll(ranks, {coll, DataType::Int32, ReduceOp::Sum, count, false, 3}, ++seed);
  });
}

TEST_P(OneProcess, InitAllRefusesAnEmptyListAndAMissingDeviceNamingTheEntry) {
  inProcesses(1, [&](int, const UniqueId&) {
    auto refused = [](const std::vector<int>& devices, const std::string& naming) {
      try {
        Communicator::initAll(devices, RunOptions::loopbackConfig());
      } catch (const Error& error) {
        require(error.code() == ErrorCode::InvalidArgument &&
                    std::string(error.what()).find(naming) != std::string::npos,
                format("initAll said: %s", error.what()));
        return;
      }
      require(false, "initAll accepted a bad device list");
    };
    refused({}, "'devices' is empty");
    refused({0, device::current()->count()}, "devices[1] is");
    refused({-1}, "devices[0] is -1");
    // Nothing half made: the process goes on to make communicators.
    std::vector<Rank> ranks = initAll({0, 0});
    runOnAll(ranks, {Coll::AllReduce, DataType::Float32, ReduceOp::Sum, 33, true, 0}, 3);
  });
}

INSTANTIATE_TEST_SUITE_P(Device, OneProcess, ::testing::Values("emulated", "cuda"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace braid::testing
