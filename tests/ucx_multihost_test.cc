// The ucx transport between "hosts" (network namespaces on a bridge,
// tests/netns_hosts.h), its network faults, its fallback to tcp, and
// BRAID_UCX. Namespace hosts share the IPC namespace, so UCX could reach
// across them through its shared memory: the ranks run with
// UCX_TLS=tcp,self, so that UCX goes over the veth link as between
// machines. No transport is forced: braid takes shm within a host and, as
// it is built with UCX, ucx between hosts. Each test skips, saying why,
// where braid has no ucx or the namespaces cannot be made.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/introspect.h"
#include "core/knobs.h"
#include "device/device.h"
#include "device_cases.h"
#include "multirank.h"
#include "netns_hosts.h"
#include "reference.h"

namespace braid::testing {
namespace {

using std::chrono::steady_clock;

bool ucxBuilt() {
  const std::vector<std::string> built = detail::builtTransports();
  return std::find(built.begin(), built.end(), "ucx") != built.end();
}

#define SKIP_UNLESS_UCX_BUILT() \
  if (!ucxBuilt()) GTEST_SKIP() << "braid was built without UCX (BRAID_UCX, libucx-dev)"

// A sysfs that lists one RDMA device (class/infiniband/mlx5_0), as on an
// RDMA cluster, where BRAID_UCX=AUTO takes ucx between hosts (without one
// it takes tcp). Only braid's choice is steered: UCX itself runs over TCP
// here. Made once by the test process, removed when it ends.
const std::string& rdmaSysfs() {
  static const struct Dir {
    std::string path;
    Dir() {
      char name[] = "/tmp/braid-sysfsXXXXXX";
      if (::mkdtemp(name)) path = name;
      if (!path.empty()) std::system(("mkdir -p " + path + "/class/infiniband/mlx5_0").c_str());
    }
    ~Dir() {
      if (!path.empty()) std::system(("rm -rf " + path).c_str());
    }
  } dir;
  return dir.path;
}

// Ranks in `hosts`, rank r on host r % hosts.size(), UCX over TCP, an RDMA
// device in their sysfs, the root in rank 0, each rank on the interface
// that routes to it.
RunOptions acrossHosts(const NamespaceHosts& hosts, std::chrono::seconds timeout,
                       std::function<void(int rank)> alsoEnter = {}) {
  const std::string sysfs = rdmaSysfs();  // made here, before the ranks fork
  RunOptions options;
  options.idConfig = Config{};
  options.idConfig->socketIfname = "eth0";
  options.config.socketIfname = "";
  options.config.timeout = timeout;
  options.deadline = std::chrono::seconds(300);
  options.enter = [&hosts, alsoEnter, sysfs](int rank) {
    hosts.enter(rank % hosts.size());
    ::setenv("UCX_TLS", "tcp,self", 1);
    ::setenv("BRAID_SYSFS", sysfs.c_str(), 1);
    if (alsoEnter) alsoEnter(rank);
  };
  return options;
}

// Every pair's transport as this rank sees it: "self", then shm within a
// host, `across` between hosts.
void requireTransports(Communicator& comm, int hosts, const std::string& across) {
  const std::vector<std::string> names = detail::peerTransports(comm);
  for (int p = 0; p < comm.size(); ++p) {
    const std::string want = p == comm.rank()                   ? "self"
                             : p % hosts == comm.rank() % hosts ? "shm"
                                                                : across;
    require(names[p] == want, format("rank %d reaches rank %d over %s, not %s", comm.rank(), p,
                                     names[p].c_str(), want.c_str()));
  }
}

// One case on host buffers, checked against the reference: "" when right.
std::string runHostCase(Communicator& comm, const Case& c, uint64_t seed) {
  const int n = comm.size(), r = comm.rank();
  const size_t size = dataTypeSize(c.type);
  const size_t whole =
      c.coll == Coll::AllGather || c.coll == Coll::ReduceScatter ? c.count * n : c.count;
  std::vector<std::byte> send = poisoned(c.type, whole), recv = poisoned(c.type, whole);
  auto at = [&](std::vector<std::byte>& b, size_t element) { return b.data() + element * size; };
  std::string problem;
  switch (c.coll) {
    case Coll::AllReduce: {
      fillInput(c.type, c.op, seed, r, 0, c.count, send.data());
      void* out = c.inPlace ? send.data() : recv.data();
      comm.allReduce(send.data(), out, c.count, c.type, c.op);
      problem = checkReduced(c.type, c.op, seed, n, 0, c.count, out);
      break;
    }
    case Coll::Broadcast: {
      if (r == c.root)
        fillInput(c.type, c.op, seed, r, 0, c.count, c.inPlace ? recv.data() : send.data());
      const void* in = c.inPlace ? recv.data() : send.data();
      comm.broadcast(in, recv.data(), c.count, c.type, c.root);
      problem = checkCopied(c.type, c.op, seed, c.root, 0, c.count, recv.data());
      break;
    }
    case Coll::Reduce: {
      fillInput(c.type, c.op, seed, r, 0, c.count, send.data());
      void* out = c.inPlace ? send.data() : recv.data();
      comm.reduce(send.data(), out, c.count, c.type, c.op, c.root);
      if (r == c.root) problem = checkReduced(c.type, c.op, seed, n, 0, c.count, out);
      break;
    }
    case Coll::AllGather: {
      void* in = c.inPlace ? at(recv, r * c.count) : send.data();
      fillInput(c.type, c.op, seed, r, 0, c.count, in);
      comm.allGather(in, recv.data(), c.count, c.type);
      for (int b = 0; b < n && problem.empty(); ++b)
        problem = checkCopied(c.type, c.op, seed, b, 0, c.count, at(recv, b * c.count));
      break;
    }
    case Coll::ReduceScatter: {
      fillInput(c.type, c.op, seed, r, 0, c.count * n, send.data());
      void* out = c.inPlace ? at(send, r * c.count) : recv.data();
      comm.reduceScatter(send.data(), out, c.count, c.type, c.op);
      problem = checkReduced(c.type, c.op, seed, n, r * c.count, c.count, out);
      break;
    }
  }
  return problem.empty() ? "" : label(c, n) + problem;
}

// Every collective, at sizes from none to many slots (1 MiB and more per
// rank in 256 KiB slots), in and out of place, from every root; then
// grouped sends around the ring (each to the other host) and a barrier.
void everyCollective(Communicator& comm, int hosts) {
  requireTransports(comm, hosts, "ucx");
  const int n = comm.size(), r = comm.rank();
  uint64_t seed = 11;
  for (Coll coll : kAllColls)
    for (DataType type : {DataType::Int32, DataType::Float32, DataType::BFloat16})
      for (ReduceOp op : reduces(coll) ? std::vector<ReduceOp>{ReduceOp::Sum, ReduceOp::Max}
                                       : std::vector<ReduceOp>{ReduceOp::Sum})
        for (size_t count : {size_t{0}, size_t{1}, size_t{1023}, (size_t{1} << 18) + 5})
          for (bool inPlace : {false, true}) {
            const Case c{coll, type, op, count, inPlace, static_cast<int>(seed % n)};
            const std::string problem = runHostCase(comm, c, ++seed);
            require(problem.empty(), problem);
          }
  for (size_t count : {size_t{0}, size_t{3}, (size_t{1} << 19) + 1}) {
    std::vector<int32_t> mine(count), theirs(count, -1);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(i * 7 + r);
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    comm.groupStart();
    comm.send(mine.data(), count, DataType::Int32, to);
    comm.recv(theirs.data(), count, DataType::Int32, from);
    comm.groupEnd();
    for (size_t i = 0; i < count; ++i)
      require(theirs[i] == static_cast<int32_t>(i * 7 + from),
              format("element %zu from rank %d is %d", i, from, theirs[i]));
  }
  comm.barrier();
}

TEST(UcxMultiHost, EveryCollectiveIsRightBetweenTwoHostsOfOneRank) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  runRanks(
      2, [](Communicator& comm) { everyCollective(comm, 2); },
      acrossHosts(hosts, std::chrono::seconds(60)));
}

// Ranks 0 and 2 on one host, 1 and 3 on the other: every ring step crosses
// hosts over ucx, and the pairs within a host take shm.
TEST(UcxMultiHost, EveryCollectiveIsRightBetweenTwoHostsOfTwoRanks) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  runRanks(
      4, [](Communicator& comm) { everyCollective(comm, 2); },
      acrossHosts(hosts, std::chrono::seconds(60)));
}

// Device buffers between ranks whose host buffers take ucx are staged
// through host memory over tcp (tcp's own connections), as between ranks
// on tcp, under the automatic choice and with BRAID_TRANSPORT=shm,ucx; the
// emulated device stands in for a GPU.
TEST(UcxMultiHost, DeviceBuffersBetweenUcxHostsAreStagedOverTcp) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  for (const std::string preference : {"", "shm,ucx"}) {
    RunOptions options =
        acrossHosts(hosts, std::chrono::seconds(60), [](int) { device::select("emulated"); });
    options.config.transports = preference;
    runRanks(
        2,
        [&](Communicator& comm) {
          requireTransports(comm, 2, "ucx");
          const std::vector<std::string> paths = detail::peerDevicePaths(comm);
          const int other = 1 - comm.rank();
          require(paths[other] == "tcp: staged through host memory",
                  format("BRAID_TRANSPORT '%s': device buffers reach rank %d by '%s'",
                         preference.c_str(), other, paths[other].c_str()));
          TestStream stream(device::current()->current());
          uint64_t seed = 5;
          for (Coll coll : kAllColls)
            for (size_t count : {size_t{1}, (size_t{1} << 18) + 5}) {
              const Case c{coll, DataType::Float32, ReduceOp::Sum, count, false, 1};
              const std::string problem = runCase(comm, stream, c, ++seed);
              require(problem.empty(), problem);
            }
        },
        options);
  }
}

// Network faults between two namespace hosts in the middle of all-reduce
// loops over ucx (runNetworkFault), at each moment of faultMoments() (two
// by default): the link taken down; a silent partition; host 1 torn down.
// Every surviving rank fails within the timeout plus 2 s, naming the
// other, and nothing hangs (runRanks' deadline, and each rank destroys its
// communicator on the way out).
TEST(UcxMultiHost, NetworkFaultsFailEverySurvivorNamingThePeerWithinTheTimeout) {
  SKIP_UNLESS_UCX_BUILT();
  for (const std::string kind : {"link down", "blackhole", "host torn down"})
    for (const auto moment : faultMoments("200,1200")) {
      NamespaceHosts hosts(2);
      if (!hosts.ready()) GTEST_SKIP() << hosts.why();
      constexpr auto kTimeout = std::chrono::seconds(5);
      RunOptions options = acrossHosts(hosts, kTimeout);
      options.deadline = std::chrono::seconds(60);
      runNetworkFault(hosts, kind, moment, options, kTimeout,
                      [](Communicator& comm) { requireTransports(comm, 2, "ucx"); });
      if (::testing::Test::HasFailure()) return;
    }
}

// A rank killed on the other host, in the middle of an all-reduce loop: UCX
// sees its connections reset (no pidfd watches a peer on another host), and
// both survivors, ranks 0 and 2 on host 0, fail with RemoteError naming
// rank 1 within 2 s of its death, long before the timeout.
TEST(UcxMultiHost, ARankKilledOnTheOtherHostFailsTheSurvivorsNamingItWithinTwoSeconds) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  struct Death {
    std::atomic<int64_t> at;  // steady clock, ns
  };
  SharedWithRanks<Death> death;
  std::atomic<int64_t>* diedAt = &death->at;
  auto nowNs = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               steady_clock::now().time_since_epoch())
        .count();
  };
  RunOptions options = acrossHosts(hosts, std::chrono::seconds(20));
  options.killed = {1};
  runRanks(
      3,
      [&](Communicator& comm) {
        requireTransports(comm, 2, "ucx");
        std::vector<float> buf(1 << 16, 1.0f);
        comm.barrier();
        if (comm.rank() == 1)
          std::thread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            diedAt->store(nowNs());
            ::kill(::getpid(), SIGKILL);
          }).detach();
        try {
          for (;;)
            comm.allReduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
        } catch (const Error& error) {
          const int64_t died = diedAt->load();
          const std::string what = error.what();
          require(error.code() == ErrorCode::RemoteError, "expected RemoteError: " + what);
          require(what.find("peer 1 ") != std::string::npos ||
                      what.find("rank 1 failed") != std::string::npos,
                  "the error does not name rank 1: " + what);
          require(died > 0 && nowNs() - died < 2'000'000'000,
                  format("failed %.3f s after the death", (nowNs() - died) / 1e9));
        }
      },
      options);
}

// The lines of every log file in `dir` that contain `needle`.
std::vector<std::string> logLines(const std::string& dir, const std::string& needle) {
  std::vector<std::string> found;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      if (entry->d_name[0] == '.') continue;
      std::ifstream file(dir + "/" + entry->d_name);
      for (std::string line; std::getline(file, line);)
        if (line.find(needle) != std::string::npos) found.push_back(line);
    }
    ::closedir(listing);
  }
  return found;
}

// A directory for the ranks' logs, removed with what is in it.
class LogDirectory {
 public:
  LogDirectory() {
    char path[] = "/tmp/braid-ucx-logXXXXXX";
    path_ = ::mkdtemp(path) ? path : "";
  }
  ~LogDirectory() {
    if (!path_.empty()) std::system(("rm -rf " + path_).c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Rank 1 cannot use UCX: it cannot start it (no usable transport), or it
// starts it on a transport nobody else has (posix shared memory only,
// which has no peer failure handling). Under BRAID_UCX=AUTO every rank
// logs one info line saying why and both take tcp (and their collectives
// work); under ON every rank fails to initialize, naming BRAID_UCX.
TEST(UcxMultiHost, WhenOneRankCannotUseUcxEveryRankFallsBackToTcpOrFailsUnderOn) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  for (const std::string tls : {"bogus", "posix"}) {
    LogDirectory logs;
    ASSERT_FALSE(logs.path().empty());
    // Set here, before anything logs: the log's settings are read once per
    // process, and the ranks inherit them.
    ::setenv("BRAID_LOG_LEVEL", "info", 1);
    ::setenv("BRAID_LOG_FILE", (logs.path() + "/log.%p").c_str(), 1);
    auto broken = [tls](int rank) {
      if (rank == 1) ::setenv("UCX_TLS", tls.c_str(), 1);
    };
    runRanks(
        2,
        [](Communicator& comm) {
          requireTransports(comm, 2, "tcp");
          int64_t mine = comm.rank() + 1, sum = 0;
          comm.allReduce(&mine, &sum, 1, DataType::Int64, ReduceOp::Sum);
          require(sum == 3, format("1 + 2 over the fallback is %lld", static_cast<long long>(sum)));
        },
        acrossHosts(hosts, std::chrono::seconds(30), broken));
    ::unsetenv("BRAID_LOG_LEVEL");
    ::unsetenv("BRAID_LOG_FILE");
    const std::vector<std::string> lines =
        logLines(logs.path(), "ucx cannot carry this communicator");
    EXPECT_EQ(lines.size(), 2u) << "UCX_TLS=" << tls << " on rank 1: one line from each rank";
    for (const std::string& line : lines) EXPECT_NE(line.find("rank 1"), std::string::npos) << line;

    RunOptions options = acrossHosts(hosts, std::chrono::seconds(30), [broken](int rank) {
      ::setenv("BRAID_UCX", "ON", 1);
      broken(rank);
    });
    runProcesses(
        2,
        [](int rank, const UniqueId& id, const Config& config) {
          try {
            Communicator::init(2, rank, id, config);
            require(false, "BRAID_UCX=ON let a communicator start without ucx");
          } catch (const Error& error) {
            const std::string what = error.what();
            require(error.code() == ErrorCode::SystemError &&
                        what.find("BRAID_UCX is ON") != std::string::npos,
                    "expected SystemError naming BRAID_UCX=ON: " + what);
          }
        },
        options);
  }
}

// Without an RDMA device on every rank, BRAID_UCX=AUTO takes tcp between
// hosts (over plain TCP braid's tcp is faster than ucx), saying why in one
// info line; ON takes ucx all the same.
TEST(UcxMultiHost, WithoutAnRdmaDeviceAutoTakesTcpAndOnTakesUcx) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  LogDirectory logs;
  ASSERT_FALSE(logs.path().empty());
  ::setenv("BRAID_LOG_LEVEL", "info", 1);
  ::setenv("BRAID_LOG_FILE", (logs.path() + "/log.%p").c_str(), 1);
  const std::string none = logs.path();  // a sysfs without class/infiniband
  runRanks(
      2,
      [](Communicator& comm) {
        requireTransports(comm, 2, "tcp");
        int32_t mine = comm.rank() + 1, sum = 0;
        comm.allReduce(&mine, &sum, 1, DataType::Int32, ReduceOp::Sum);
        require(sum == 3, "1 + 2 over tcp");
      },
      acrossHosts(hosts, std::chrono::seconds(30), [none](int rank) {
        // Rank 1 only: one rank without a device is enough.
        if (rank == 1) ::setenv("BRAID_SYSFS", none.c_str(), 1);
      }));
  ::unsetenv("BRAID_LOG_LEVEL");
  ::unsetenv("BRAID_LOG_FILE");
  const std::vector<std::string> lines = logLines(logs.path(), "rank 1 has no RDMA device");
  EXPECT_EQ(lines.size(), 2u) << "one line from each rank";
  runRanks(
      2,
      [](Communicator& comm) {
        requireTransports(comm, 2, "ucx");
        int32_t mine = comm.rank() + 1, sum = 0;
        comm.allReduce(&mine, &sum, 1, DataType::Int32, ReduceOp::Sum);
        require(sum == 3, "1 + 2 over ucx");
      },
      acrossHosts(hosts, std::chrono::seconds(30), [none](int) {
        ::setenv("BRAID_SYSFS", none.c_str(), 1);
        ::setenv("BRAID_UCX", "ON", 1);
      }));
}

// BRAID_UCX=OFF keeps the automatic choice off ucx (tcp between hosts);
// ranks that set it differently are refused, every one naming the knob.
TEST(UcxMultiHost, BraidUcxOffTakesTcpAndRanksMustSetItAlike) {
  SKIP_UNLESS_UCX_BUILT();
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  runRanks(
      2,
      [](Communicator& comm) {
        requireTransports(comm, 2, "tcp");
        int32_t mine = comm.rank() + 1, sum = 0;
        comm.allReduce(&mine, &sum, 1, DataType::Int32, ReduceOp::Sum);
        require(sum == 3, "1 + 2 over tcp");
      },
      acrossHosts(hosts, std::chrono::seconds(30), [](int) { ::setenv("BRAID_UCX", "off", 1); }));
  runProcesses(
      2,
      [](int rank, const UniqueId& id, const Config& config) {
        try {
          Communicator::init(2, rank, id, config);
          require(false, "ranks with BRAID_UCX AUTO and OFF made a communicator");
        } catch (const Error& error) {
          const std::string what = error.what();
          require(
              error.code() == ErrorCode::InvalidArgument &&
                  what.find("BRAID_UCX is AUTO on rank 0 and OFF on rank 1") != std::string::npos,
              "expected InvalidArgument naming BRAID_UCX on both ranks: " + what);
        }
      },
      acrossHosts(hosts, std::chrono::seconds(30),
                  [](int rank) { ::setenv("BRAID_UCX", rank == 0 ? "AUTO" : "OFF", 1); }));
}

// On one host, no namespaces needed.
TEST(UcxKnob, ABadBraidUcxIsRefusedNamingIt) {
  ::setenv("BRAID_UCX", "maybe", 1);
  try {
    Knobs::resolve(Config{});
    ADD_FAILURE() << "BRAID_UCX=maybe was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(error.what()).find("BRAID_UCX: 'maybe' is not AUTO, ON or OFF"),
              std::string::npos)
        << error.what();
  }
  ::unsetenv("BRAID_UCX");
  runProcesses(2, [](int rank, const UniqueId& id, const Config& config) {
    ::setenv("BRAID_UCX", "maybe", 1);  // after the id was made
    try {
      Communicator::init(2, rank, id, config);
      require(false, "a communicator started with BRAID_UCX=maybe");
    } catch (const Error& error) {
      require(error.code() == ErrorCode::InvalidArgument &&
                  std::string(error.what()).find("BRAID_UCX") != std::string::npos,
              std::string("expected InvalidArgument naming BRAID_UCX: ") + error.what());
    }
  });
  for (const char* good : {"AUTO", "on", "Off"}) {
    ::setenv("BRAID_UCX", good, 1);
    EXPECT_NO_THROW(Knobs::resolve(Config{})) << good;
  }
  ::unsetenv("BRAID_UCX");
}

}  // namespace
}  // namespace braid::testing
