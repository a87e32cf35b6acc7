// The ibverbs transport's protocol engine over the fake fabric
// (BRAID_IB_FAKE): faults the fabric injects, messages striped over several
// QPs, knobs that ranks must set alike or within range, and the automatic
// choice between namespace hosts; device buffers over it, read and written
// by the NIC (GPUDirect RDMA) or staged. (The collectives, communicator
// and device suites run over it too: ibverbs_fake.*, ibverbs_gdr.* and
// ibverbs_staged.* in tests/CMakeLists.txt.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "braid/communicator.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "device/device.h"
#include "device_support.h"
#include "multirank.h"
#include "netns_hosts.h"

namespace braid::testing {
namespace {

using std::chrono::steady_clock;

// A fabric of this test process's own, so parallel test processes never
// meet.
std::string fabric() { return "ibtest" + std::to_string(::getpid()); }

// Every rank on ibverbs over the fake fabric, with `knobs` set in its
// process before it starts (a rank's own: set(rank) returns them).
RunOptions overFakeFabric(
    std::function<std::vector<std::pair<std::string, std::string>>(int)> set = nullptr) {
  RunOptions options;
  options.config.transports = "ibverbs";
  const std::string name = fabric();
  options.enter = [name, set](int rank) {
    ::setenv("BRAID_IB_FAKE", name.c_str(), 1);
    if (set)
      for (const auto& [knob, value] : set(rank)) ::setenv(knob.c_str(), value.c_str(), 1);
  };
  return options;
}

// Every rank recorded when it failed (steady_clock ticks; 0: never), and
// the last within 2 s of the first.
template <size_t N>
void expectEveryRankFailedWithinTwoSeconds(const std::atomic<int64_t> (&at)[N],
                                           const std::string& what) {
  int64_t first = INT64_MAX, last = 0;
  for (const auto& rank : at) {
    ASSERT_NE(rank.load(), 0) << what << ": a rank never failed";
    first = std::min(first, rank.load());
    last = std::max(last, rank.load());
  }
  EXPECT_LT(std::chrono::nanoseconds(last - first), std::chrono::seconds(2)) << what;
}

// overFakeFabric() on the emulated device, with BRAID_IB_GDR = `gdr`
// and small device slots, so that modest counts cross many of them.
RunOptions deviceOverFakeFabric(
    const std::string& gdr,
    std::function<std::vector<std::pair<std::string, std::string>>(int)> more = nullptr) {
  RunOptions options = overFakeFabric([gdr, more](int rank) {
    std::vector<std::pair<std::string, std::string>> knobs;
    if (more) knobs = more(rank);
    knobs.push_back({"BRAID_IB_GDR", gdr});
    knobs.push_back({"BRAID_DEVICE_SLOT_BYTES", "64K"});
    return knobs;
  });
  const auto enter = options.enter;
  options.enter = [enter](int rank) {
    enter(rank);
    device::select("emulated");
  };
  return options;
}

// Device buffers between every pair reach it by `path`, and an all-reduce,
// a broadcast from every root and a ring of sends on them are exact, at
// counts from 1 element to many slots.
void checkDeviceBuffers(Communicator& comm, const std::string& path) {
  const std::vector<std::string> paths = detail::peerDevicePaths(comm);
  for (int p = 0; p < comm.size(); ++p)
    if (p != comm.rank())
      require(paths[p] == path, format("rank %d's device buffers go by '%s', not '%s'", p,
                                       paths[p].c_str(), path.c_str()));
  const int dev = device::current()->current();
  const int r = comm.rank(), n = comm.size();
  TestStream stream(dev);
  for (size_t count : {size_t{1}, size_t{1023}, (size_t{1} << 18) + 5}) {
    std::vector<int32_t> values(count), got(count);
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<int32_t>(i % 977) * (r + 1);
    DeviceBuffer in(dev, count * 4), out(dev, count * 4);
    in.upload(values.data());
    comm.allReduce(in.data(), out.data(), count, DataType::Int32, ReduceOp::Sum, stream.stream())
        .wait();
    std::vector<std::byte> bytes = out.download();
    std::memcpy(got.data(), bytes.data(), count * 4);
    for (size_t i = 0; i < count; ++i)
      require(got[i] == static_cast<int32_t>(i % 977) * n * (n + 1) / 2,
              format("all-reduce of %zu: element %zu is %d", count, i, got[i]));
    for (int root = 0; root < n; ++root) {
      comm.broadcast(in.data(), out.data(), count, DataType::Int32, root, stream.stream()).wait();
      bytes = out.download();
      std::memcpy(got.data(), bytes.data(), count * 4);
      for (size_t i = 0; i < count; ++i)
        require(got[i] == static_cast<int32_t>(i % 977) * (root + 1),
                format("broadcast of %zu from %d: element %zu is %d", count, root, i, got[i]));
    }
    comm.groupStart();
    comm.send(in.data(), count, DataType::Int32, (r + 1) % n, stream.stream());
    comm.recv(out.data(), count, DataType::Int32, (r + n - 1) % n, stream.stream());
    comm.groupEnd();
    stream.synchronize();
    bytes = out.download();
    std::memcpy(got.data(), bytes.data(), count * 4);
    const int from = (r + n - 1) % n;
    for (size_t i = 0; i < count; ++i)
      require(got[i] == static_cast<int32_t>(i % 977) * (from + 1),
              format("send of %zu from %d: element %zu is %d", count, from, i, got[i]));
  }
}

// The emulated device's memory is a memfd, which the fake fabric registers
// as it would a GPU's dma-buf: the NIC writes straight into the peer's
// device slots, and a flush READ precedes every `filled`.
TEST(Ibverbs, DeviceBuffersGoOverGpuDirectRdmaWhereTheDeviceGivesADmabuf) {
  for (const char* gdr : {"AUTO", "ON"})
    runRanks(
        3,
        [](Communicator& comm) { checkDeviceBuffers(comm, "ibverbs: GPUDirect RDMA (dma-buf)"); },
        deviceOverFakeFabric(gdr));
}

TEST(Ibverbs, DeviceBuffersAreStagedThroughHostMemoryUnderBraidIbGdrOff) {
  runRanks(
      3,
      [](Communicator& comm) { checkDeviceBuffers(comm, "ibverbs: staged through host memory"); },
      deviceOverFakeFabric("OFF"));
}

// A fault in rank 1's device QPs mid-loop, on either path: every rank
// fails within 2 s of the first, a rank at either end of the broken QP
// naming the peer and the work completion status (whichever end reports
// first), and no stream stays blocked.
TEST(Ibverbs, AFaultOnADeviceConnectionFailsEveryRankWithinTwoSeconds) {
  constexpr int kRanks = 3;
  struct Failures {
    std::atomic<int64_t> at[kRanks];
    std::atomic<int> named;  // some rank's error said IBV_WC_RETRY_EXC_ERR
  };
  SharedWithRanks<Failures> failures;
  Failures* shared = failures.operator->();
  for (const char* gdr : {"ON", "OFF"}) {
    for (auto& at : shared->at) at.store(0);
    shared->named.store(0);
    RunOptions options = deviceOverFakeFabric(gdr, [](int rank) {
      // (No calibration at creation: the fault must hit device messages.)
      std::vector<std::pair<std::string, std::string>> knobs = {{"BRAID_TUNING", "model"}};
      if (rank == 1) knobs.push_back({"BRAID_IB_FAKE_FAULT", "retry@200"});
      return knobs;
    });
    options.deadline = std::chrono::seconds(60);
    runRanks(
        kRanks,
        [&](Communicator& comm) {
          const int dev = device::current()->current();
          TestStream stream(dev);
          const size_t count = 1 << 15;
          DeviceBuffer buffer(dev, count * 4);
          try {
            for (int i = 0; i < 100000; ++i)
              comm.allReduce(buffer.data(), buffer.data(), count, DataType::Float32, ReduceOp::Sum,
                             stream.stream())
                  .wait();
            require(false, "100000 all-reduces ran past the fault");
          } catch (const Error& error) {
            shared->at[comm.rank()].store(steady_clock::now().time_since_epoch().count());
            const std::string what = error.what();
            require(error.code() == ErrorCode::RemoteError || error.code() == ErrorCode::Timeout,
                    "wrong error: " + what);
            require(
                what.find("peer ") != std::string::npos || what.find("rank ") != std::string::npos,
                "no rank named: " + what);
            if (what.find("IBV_WC_RETRY_EXC_ERR") != std::string::npos) shared->named.store(1);
            const auto before = steady_clock::now();
            stream.synchronize();
            require(steady_clock::now() - before < std::chrono::seconds(2),
                    "the stream stayed blocked after the op failed");
          }
        },
        options);
    expectEveryRankFailedWithinTwoSeconds(shared->at, gdr);
    EXPECT_EQ(shared->named.load(), 1) << gdr << ": no rank named IBV_WC_RETRY_EXC_ERR";
  }
}

TEST(Ibverbs, EveryPairUsesIbverbsAndAllReduceIsExactAt3Ranks) {
  runRanks(
      3,
      [](Communicator& comm) {
        const std::vector<std::string> names = detail::peerTransports(comm);
        for (int p = 0; p < comm.size(); ++p)
          require(names[p] == (p == comm.rank() ? "self" : "ibverbs"),
                  "rank " + std::to_string(p) + " is reached over " + names[p]);
        std::vector<int64_t> in(1 << 18), out(1 << 18);
        for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i) * (comm.rank() + 1);
        comm.allReduce(in.data(), out.data(), in.size(), DataType::Int64, ReduceOp::Sum);
        for (size_t i = 0; i < out.size(); ++i)
          require(out[i] == static_cast<int64_t>(i) * 6, "wrong sum at " + std::to_string(i));
      },
      overFakeFabric());
}

// Four QPs per connection: messages from 128 KiB up go in parts over
// several of them, whose receive completions arrive in any order.
TEST(Ibverbs, MessagesStripedOverFourQpsArriveIntact) {
  runRanks(
      3,
      [](Communicator& comm) {
        const int r = comm.rank(), n = comm.size();
        std::vector<float> in(size_t{8} << 20 >> 2), out(in.size());
        for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i % 1000) + r);
        comm.allReduce(in.data(), out.data(), in.size(), DataType::Float32, ReduceOp::Sum);
        for (size_t i = 0; i < out.size(); ++i)
          require(out[i] == static_cast<float>(3 * (i % 1000) + 3), "wrong all-reduce");
        // Odd lengths around the part boundaries, to the next rank.
        for (size_t bytes : {size_t{1}, size_t{131071}, size_t{131072}, size_t{262143},
                             size_t{262144}, size_t{1} << 20}) {
          std::vector<uint8_t> mine(bytes), theirs(bytes, 0);
          for (size_t i = 0; i < bytes; ++i) mine[i] = static_cast<uint8_t>(i * 7 + r);
          comm.groupStart();
          comm.send(mine.data(), bytes, DataType::Uint8, (r + 1) % n);
          comm.recv(theirs.data(), bytes, DataType::Uint8, (r + n - 1) % n);
          comm.groupEnd();
          const int from = (r + n - 1) % n;
          for (size_t i = 0; i < bytes; ++i)
            require(theirs[i] == static_cast<uint8_t>(i * 7 + from),
                    "byte " + std::to_string(i) + " of " + std::to_string(bytes));
        }
        // The sends to the next rank (1 MiB among them) went over all four
        // QPs.
        const std::vector<uint64_t> stripes = detail::stripePosts(comm, (r + 1) % n);
        require(stripes.size() == 4, format("%zu stripes to the next rank", stripes.size()));
        for (size_t q = 0; q < stripes.size(); ++q)
          require(stripes[q] > 0, format("QP %zu to the next rank carried no part", q));
      },
      overFakeFabric([](int) {
        return std::vector<std::pair<std::string, std::string>>{
            {"BRAID_IB_QPS_PER_CONNECTION", "4"}};
      }));
}

// A fault the fabric injects into rank 1's QPs mid-loop: rank 1 fails
// naming the peer and the work completion status, and every rank fails
// within 2 s of the first, none hanging.
TEST(Ibverbs, InjectedFaultsFailEveryRankNamingThePeerWithinTwoSeconds) {
  constexpr int kRanks = 3;
  struct Failures {
    std::atomic<int64_t> at[kRanks];
  };
  SharedWithRanks<Failures> failures;
  Failures* shared = failures.operator->();
  const std::pair<const char*, const char*> faults[] = {
      {"retry@3000", "IBV_WC_RETRY_EXC_ERR"},
      {"rkey@3000", "IBV_WC_REM_ACCESS_ERR"},
      {"flush@3000", "IBV_WC_WR_FLUSH_ERR"},
  };
  for (const auto& [fault, status] : faults) {
    for (auto& at : shared->at) at.store(0);
    RunOptions options = overFakeFabric([fault = std::string(fault)](int rank) {
      std::vector<std::pair<std::string, std::string>> knobs;
      if (rank == 1) knobs.push_back({"BRAID_IB_FAKE_FAULT", fault});
      return knobs;
    });
    options.deadline = std::chrono::seconds(60);
    runRanks(
        kRanks,
        [&, status = std::string(status)](Communicator& comm) {
          std::vector<float> buf(1 << 14, 1.0f);
          try {
            for (int i = 0; i < 100000; ++i)
              comm.allReduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
            require(false, "100000 all-reduces ran past the fault");
          } catch (const Error& error) {
            shared->at[comm.rank()].store(steady_clock::now().time_since_epoch().count());
            const std::string what = error.what();
            require(error.code() == ErrorCode::RemoteError || error.code() == ErrorCode::Timeout,
                    "wrong error: " + what);
            if (comm.rank() == 1) {
              require(what.find(status) != std::string::npos,
                      "rank 1 does not say " + status + ": " + what);
              require(what.find("peer ") != std::string::npos, "no peer named: " + what);
            }
          }
        },
        options);
    expectEveryRankFailedWithinTwoSeconds(shared->at, fault);
  }
}

TEST(Ibverbs, RanksWithDifferentQpCountsAreRejectedNamingTheKnob) {
  RunOptions options = overFakeFabric([](int rank) {
    return std::vector<std::pair<std::string, std::string>>{
        {"BRAID_IB_QPS_PER_CONNECTION", rank == 0 ? "2" : "1"}};
  });
  runProcesses(
      2,
      [](int rank, const UniqueId& id, const Config& config) {
        requireError([&] { Communicator::init(2, rank, id, config); }, ErrorCode::InvalidArgument,
                     "BRAID_IB_QPS_PER_CONNECTION");
      },
      options);
}

TEST(Ibverbs, AKnobOutOfRangeIsRejectedNamingIt) {
  for (const auto& [knob, value] :
       std::vector<std::pair<std::string, std::string>>{{"BRAID_IB_TIMEOUT", "32"},
                                                        {"BRAID_IB_RETRY_CNT", "8"},
                                                        {"BRAID_IB_QPS_PER_CONNECTION", "17"},
                                                        {"BRAID_IB_HCA", "=mlx5_0,"},
                                                        {"BRAID_IB_FAKE_FAULT", "sometimes"}}) {
    RunOptions options = overFakeFabric([knob = knob, value = value](int) {
      return std::vector<std::pair<std::string, std::string>>{{knob, value}};
    });
    runProcesses(
        2,
        [knob = knob](int rank, const UniqueId& id, const Config& config) {
          requireError([&] { Communicator::init(2, rank, id, config); }, ErrorCode::InvalidArgument,
                       knob);
        },
        options);
  }
}

// Without a device (no fake fabric, and this machine has none), naming
// ibverbs is an error that says why, on every rank.
TEST(Ibverbs, NamingIbverbsWithoutADeviceFailsSayingWhy) {
  if (detail::transportStatus("ibverbs").empty()) GTEST_SKIP() << "this machine has an RDMA device";
  RunOptions options;
  options.config.transports = "ibverbs";
  runProcesses(
      2,
      [](int rank, const UniqueId& id, const Config& config) {
        requireError([&] { Communicator::init(2, rank, id, config); }, ErrorCode::SystemError,
                     "BRAID_TRANSPORT names ibverbs");
      },
      options);
}

// Between namespace hosts the automatic choice takes ibverbs where every
// rank has an active port (here the fake fabric's), shm within a host; and
// without one tcp, or an error under BRAID_IBVERBS=ON. Device buffers
// between the hosts follow: over ibverbs, or staged over tcp.
TEST(Ibverbs, BetweenHostsAutoTakesIbverbsWhereEveryRankHasAPort) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  for (const char* mode : {"fake", "none", "on"}) {
    RunOptions options;
    options.idConfig = Config{};
    options.idConfig->socketIfname = "eth0";
    options.config.socketIfname = "";
    options.config.timeout = std::chrono::seconds(30);
    options.deadline = std::chrono::seconds(60);
    const std::string name = fabric(), which = mode;
    options.enter = [&hosts, name, which](int rank) {
      hosts.enter(rank % 2);
      device::select("emulated");
      if (which == "fake") ::setenv("BRAID_IB_FAKE", name.c_str(), 1);
      if (which == "on") ::setenv("BRAID_IBVERBS", "ON", 1);
    };
    if (which == "on") {
      runProcesses(
          2,
          [](int rank, const UniqueId& id, const Config& config) {
            requireError([&] { Communicator::init(2, rank, id, config); }, ErrorCode::SystemError,
                         "BRAID_IBVERBS is ON");
          },
          options);
      continue;
    }
    runRanks(
        4,
        [which](Communicator& comm) {
          const std::vector<std::string> names = detail::peerTransports(comm);
          const std::string across = which == "fake" ? "ibverbs" : "tcp";
          for (int p = 0; p < comm.size(); ++p) {
            const char* want = p == comm.rank()           ? "self"
                               : p % 2 == comm.rank() % 2 ? "shm"
                                                          : across.c_str();
            require(names[p] == want,
                    format("rank %d is reached over %s, not %s", p, names[p].c_str(), want));
          }
          std::vector<int32_t> in(1 << 16, comm.rank() + 1), out(in.size());
          comm.allReduce(in.data(), out.data(), in.size(), DataType::Int32, ReduceOp::Sum);
          for (int32_t v : out) require(v == 10, "wrong all-reduce across hosts");
          const std::vector<std::string> paths = detail::peerDevicePaths(comm);
          const std::string deviceAcross = which == "fake" ? "ibverbs: GPUDirect RDMA (dma-buf)"
                                                           : "tcp: staged through host memory";
          for (int p = 0; p < comm.size(); ++p)
            if (p % 2 != comm.rank() % 2)
              require(paths[p] == deviceAcross,
                      format("rank %d's device buffers go by '%s'", p, paths[p].c_str()));
          const int dev = device::current()->current();
          TestStream stream(dev);
          DeviceBuffer buffer(dev, in.size() * 4);
          buffer.upload(in.data());
          comm.allReduce(buffer.data(), buffer.data(), in.size(), DataType::Int32, ReduceOp::Sum,
                         stream.stream())
              .wait();
          const std::vector<std::byte> bytes = buffer.download();
          std::memcpy(out.data(), bytes.data(), bytes.size());
          for (int32_t v : out) require(v == 10, "wrong all-reduce of device buffers across hosts");
        },
        options);
  }
}

}  // namespace
}  // namespace braid::testing
