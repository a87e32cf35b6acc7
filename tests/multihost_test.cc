// Ranks on several "hosts": network namespaces joined through a bridge
// (tests/netns_hosts.h), which braid tells apart as hosts. Each test makes
// its namespaces and removes them; it skips when it cannot (not root, no
// `ip`, no namespace support).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "device/device.h"
#include "device_cases.h"
#include "multirank.h"
#include "netns_hosts.h"
#include "reference.h"

namespace braid::testing {
namespace {

// Options for ranks on namespace hosts, rank r entering host hostOf(r):
// the job id made in host 0 on its eth0, each rank on the interface that
// routes to the root, tcp across hosts even where ucx is built (ucx has
// its own suite, ucx_multihost_test.cc), the communicator's timeout and
// the harness's deadline.
RunOptions onHosts(NamespaceHosts& hosts, std::function<int(int)> hostOf,
                   std::chrono::milliseconds timeout, std::chrono::seconds deadline) {
  RunOptions options;
  options.idConfig = Config{};
  options.idConfig->socketIfname = "eth0";
  options.config.socketIfname = "";
  options.config.transports = "shm,tcp";
  options.config.timeout = timeout;
  options.deadline = deadline;
  options.enter = [&hosts, hostOf](int rank) { hosts.enter(hostOf(rank)); };
  return options;
}

// Every pair's transport as this rank sees it: "self", shm between ranks
// of one host (hostOf), tcp between hosts.
void requireShmWithinTcpAcross(Communicator& comm, const std::function<int(int)>& hostOf) {
  const std::vector<std::string> names = detail::peerTransports(comm);
  const int r = comm.rank();
  for (int p = 0; p < comm.size(); ++p) {
    const char* want = p == r ? "self" : hostOf(p) == hostOf(r) ? "shm" : "tcp";
    require(names[p] == want,
            format("rank %d is reached over %s, not %s", p, names[p].c_str(), want));
  }
}

TEST(MultiHost, CollectivesAcrossTwoNetworkNamespacesOverTcp) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();

  // The root lives in rank 0, inside host 0. No transport is forced: the
  // namespaces are two hosts to braid, so every pair takes tcp.
  RunOptions options = onHosts(
      hosts, [](int rank) { return rank % 2; }, std::chrono::seconds(30), std::chrono::seconds(60));
  runRanks(
      4,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        requireShmWithinTcpAcross(comm, [](int q) { return q % 2; });
        std::vector<int64_t> in(1 << 20), out(1 << 20);
        for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i) * (r + 1);
        comm.allReduce(in.data(), out.data(), in.size(), DataType::Int64, ReduceOp::Sum);
        for (size_t i = 0; i < out.size(); ++i)
          require(out[i] == static_cast<int64_t>(i) * 10, "wrong all-reduce across hosts");
        std::vector<int32_t> mine(1000, r), all(1000 * n, -1);
        comm.allGather(mine.data(), all.data(), mine.size(), DataType::Int32);
        for (int b = 0; b < n; ++b)
          for (int i = 0; i < 1000; ++i)
            require(all[b * 1000 + i] == b, "wrong all-gather across hosts");
      },
      options);
}

TEST(MultiHost, SocketIfnameSelectsTheInterface) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  RunOptions options;
  options.idConfig = Config{};
  options.idConfig->socketIfname = "eth0";
  options.enter = [&](int rank) { hosts.enter(rank); };
  runProcesses(
      2,
      [](int rank, const UniqueId& id, const Config& base) {
        Config config = base;
        config.socketIfname = "eth0";
        Communicator comm = Communicator::init(2, rank, id, config);
        int32_t x = rank + 1, sum = 0;
        comm.allReduce(&x, &sum, 1, DataType::Int32, ReduceOp::Sum);
        require(sum == 3, "1 + 2 across the veth pair");
        Config wrong = base;
        wrong.socketIfname = "nosuchif0";
        try {
          Communicator::init(2, rank, id, wrong);
          require(false, "an unknown interface was accepted");
        } catch (const Error& error) {
          require(std::string(error.what()).find("BRAID_SOCKET_IFNAME") != std::string::npos,
                  std::string("the error names BRAID_SOCKET_IFNAME: ") + error.what());
        }
      },
      options);
}

// Four hosts of two ranks each (rank r on host r % 4): shm between the
// two ranks of a host, tcp between hosts, chosen from the host identities
// alone; every collective right, at sizes that cross many slots.
TEST(MultiHost, FourHostsOfTwoRanksTakeShmWithinAndTcpAcross) {
  NamespaceHosts hosts(4);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  RunOptions options = onHosts(
      hosts, [](int rank) { return rank % 4; }, std::chrono::seconds(30),
      std::chrono::seconds(120));
  runRanks(
      8,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        requireShmWithinTcpAcross(comm, [](int q) { return q % 4; });
        const size_t count = (1 << 19) + 3;
        std::vector<int64_t> in(count), out(count);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<int64_t>(i % 1000) * (r + 1);
        comm.allReduce(in.data(), out.data(), count, DataType::Int64, ReduceOp::Sum);
        for (size_t i = 0; i < count; ++i)
          require(out[i] == static_cast<int64_t>(i % 1000) * n * (n + 1) / 2,
                  format("all-reduce element %zu is %lld", i, static_cast<long long>(out[i])));
        std::vector<float> part(4099, static_cast<float>(r)), all(4099 * n, -1);
        comm.allGather(part.data(), all.data(), part.size(), DataType::Float32);
        for (int q = 0; q < n; ++q)
          require(all[q * 4099 + 4098] == static_cast<float>(q), "all-gather across hosts");
        std::vector<float> scattered(4099, -1), whole(4099 * n, 1.0f);
        comm.reduceScatter(whole.data(), scattered.data(), 4099, DataType::Float32, ReduceOp::Sum);
        require(scattered[17] == static_cast<float>(n), "reduce-scatter across hosts");
        float value = r == 5 ? 42.0f : 0.0f;
        comm.broadcast(&value, &value, 1, DataType::Float32, 5);
        require(value == 42.0f, "broadcast from another host");
      },
      options);
}

// Every collective braid runs hierarchically (BRAID_ALGO=hier), on two
// hosts of three ranks numbered host by host: exact integers, Avg's single
// division and float sums within their bound, in place and out of place,
// at sizes of one element, a few slots and many chunks, from roots on
// either host.
TEST(MultiHost, HierarchicalCollectivesAreExactOnTwoHostsOfThreeRanks) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  RunOptions options = onHosts(
      hosts, [](int rank) { return rank / 3; }, std::chrono::seconds(30),
      std::chrono::seconds(180));
  options.config.chunkBytes = 64 << 10;  // many rounds at the largest size
  options.enter = [&](int rank) {
    hosts.enter(rank / 3);
    ::setenv("BRAID_ALGO", "hier", 1);
  };
  runRanks(
      6,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        requireShmWithinTcpAcross(comm, [](int q) { return q / 3; });
        uint64_t seed = 11;
        for (DataType type : {DataType::Int64, DataType::Float32})
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
            for (size_t count : {size_t{1}, size_t{1000}, (size_t{1} << 18) + 7})
              for (bool inPlace : {false, true}) {
                if (type == DataType::Int64 && op == ReduceOp::Avg) continue;
                ++seed;
                const size_t size = dataTypeSize(type);
                const std::string what =
                    format("count %zu%s, seed %llu", count, inPlace ? ", in place" : "",
                           static_cast<unsigned long long>(seed));
                // All-reduce.
                std::vector<std::byte> in(count * size), out = poisoned(type, count);
                fillInput(type, op, seed, r, 0, count, in.data());
                void* dst = inPlace ? in.data() : out.data();
                comm.allReduce(in.data(), dst, count, type, op);
                require(detail::lastAlgorithm(comm) == "hier", "all-reduce not hierarchical");
                std::string problem = checkReduced(type, op, seed, n, 0, count, dst);
                require(problem.empty(), "all-reduce, " + what + ": " + problem);
                // Reduce-scatter: block b of every rank's input at global
                // indices b * count.
                std::vector<std::byte> whole(n * count * size), mine = poisoned(type, count);
                fillInput(type, op, seed, r, 0, n * count, whole.data());
                void* part = inPlace ? whole.data() + r * count * size : mine.data();
                comm.reduceScatter(whole.data(), part, count, type, op);
                require(detail::lastAlgorithm(comm) == "hier", "reduce-scatter not hierarchical");
                problem = checkReduced(type, op, seed, n, r * count, count, part);
                require(problem.empty(), "reduce-scatter, " + what + ": " + problem);
                if (op != ReduceOp::Sum) continue;
                // All-gather: rank q's block at global indices q * count.
                std::vector<std::byte> gathered = poisoned(type, n * count);
                std::vector<std::byte> block(count * size);
                fillInput(type, op, seed, r, r * count, count, block.data());
                if (inPlace)
                  std::memcpy(gathered.data() + r * count * size, block.data(), block.size());
                comm.allGather(inPlace ? gathered.data() + r * count * size : block.data(),
                               gathered.data(), count, type);
                require(detail::lastAlgorithm(comm) == "hier", "all-gather not hierarchical");
                for (int q = 0; q < n && problem.empty(); ++q)
                  problem = checkCopied(type, op, seed, q, q * count, count,
                                        gathered.data() + q * count * size);
                require(problem.empty(), "all-gather, " + what + ": " + problem);
                // Broadcast from a rank of either host.
                for (int root : {1, 5}) {
                  std::vector<std::byte> data = poisoned(type, count);
                  if (r == root) fillInput(type, op, seed, root, 0, count, data.data());
                  std::vector<std::byte> got = poisoned(type, count);
                  comm.broadcast(data.data(), inPlace ? data.data() : got.data(), count, type,
                                 root);
                  require(detail::lastAlgorithm(comm) == "hier", "broadcast not hierarchical");
                  problem = checkCopied(type, op, seed, root, 0, count,
                                        inPlace ? data.data() : got.data());
                  require(problem.empty(),
                          format("broadcast from %d, ", root) + what + ": " + problem);
                }
              }
      },
      options);
}

// Left to choose, braid takes the hierarchical algorithms for large
// buffers when ranks are numbered host by host (two hosts of two), and not
// when each host's ranks are spread out (rank r on host r % 2).
TEST(MultiHost, TheTunerPicksHierarchicalAlgorithmsForRanksNumberedHostByHost) {
  for (bool byHost : {true, false}) {
    NamespaceHosts hosts(2);
    if (!hosts.ready()) GTEST_SKIP() << hosts.why();
    RunOptions options = onHosts(
        hosts, [byHost](int rank) { return byHost ? rank / 2 : rank % 2; },
        std::chrono::seconds(30), std::chrono::seconds(120));
    // The model's choice, not measured trials: on a loaded 2-vCPU machine
    // the trials' timings are noise, and what this checks is that the
    // tuner weighs hier wherever the layout allows it.
    options.enter = [enter = options.enter](int rank) {
      ::setenv("BRAID_TUNING", "model", 1);
      enter(rank);
    };
    runRanks(
        4,
        [byHost](Communicator& comm) {
          const size_t count = size_t{4} << 20 >> 2;  // 4 MiB of floats
          std::vector<float> in(count, 1.0f), out(count * comm.size());
          comm.allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
          require(out[count - 1] == 4.0f, "all-reduce");
          const std::string algorithm = detail::lastAlgorithm(comm);
          require((algorithm == "hier") == byHost,
                  format("the all-reduce ran '%s' with ranks %s", algorithm.c_str(),
                         byHost ? "host by host" : "spread over the hosts"));
          comm.allGather(in.data(), out.data(), count, DataType::Float32);
          require((detail::lastAlgorithm(comm) == "hier") == byHost, "all-gather");
        },
        options);
  }
}

// A link throttled to 20 Mbit/s each way (tc's token bucket on both hosts'
// eth0): a 4 MiB all-reduce then takes seconds, every result is still
// right, and nothing times out at the default timeout.
TEST(MultiHost, AThrottledLinkSlowsTheJobButEveryResultIsRight) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  for (int h = 0; h < 2; ++h) {
    const std::string throttle = "ip netns exec " + hosts.name(h) +
                                 " tc qdisc add dev eth0 root tbf rate 20mbit burst 32kb"
                                 " latency 200ms";
    if (std::system(throttle.c_str()) != 0) GTEST_SKIP() << "tc cannot add a tbf qdisc here";
  }
  RunOptions options = onHosts(
      hosts, [](int rank) { return rank; }, std::chrono::seconds(0), std::chrono::seconds(120));
  // (A timeout of 0 leaves BRAID_TIMEOUT's default.)
  runRanks(
      2,
      [](Communicator& comm) {
        const int r = comm.rank();
        const size_t count = size_t{1} << 20;  // 4 MiB of int32
        std::vector<int32_t> in(count), out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(i % 977) * (r + 1);
        const auto start = std::chrono::steady_clock::now();
        for (int round = 0; round < 2; ++round) {
          comm.allReduce(in.data(), out.data(), count, DataType::Int32, ReduceOp::Sum);
          for (size_t i = 0; i < count; ++i)
            require(out[i] == static_cast<int32_t>(i % 977) * 3,
                    format("all-reduce element %zu is %d", i, out[i]));
        }
        std::vector<int32_t> all(2 * 4096, -1), mine(4096, r + 7);
        comm.allGather(mine.data(), all.data(), mine.size(), DataType::Int32);
        require(all[0] == 7 && all[4096] == 8, "all-gather over the throttled link");
        // 2 x 4 MiB each way at 20 Mbit/s is 3.4 s: under 2 s, nothing was throttled.
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        require(seconds > 2.0, format("the throttled all-reduces took only %.2f s", seconds));
      },
      options);
}

// Two hosts of two ranks (tcp across, shm within): a rank of host 1 is
// killed; the three survivors agree on it, shrink, and the shrunk
// communicator runs collectives across the hosts; then a rank of host 0
// leaves, alive, and the other two shrink without it by a list.
TEST(MultiHost, SurvivorsAcrossHostsShrinkAfterAKillAndAfterALeave) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  RunOptions options = onHosts(
      hosts, [](int rank) { return rank / 2; }, std::chrono::seconds(30), std::chrono::seconds(90));
  options.killed = {3};
  runRanks(
      4,
      [](Communicator& comm) {
        auto sumIsRight = [](Communicator& c) {
          std::vector<int32_t> in(4096, c.rank() + 1), out(4096);
          c.allReduce(in.data(), out.data(), in.size(), DataType::Int32, ReduceOp::Sum);
          require(out[4095] == c.size() * (c.size() + 1) / 2, format("sum %d", out[4095]));
        };
        sumIsRight(comm);
        if (comm.rank() == 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          ::raise(SIGKILL);
        }
        try {
          for (;;) sumIsRight(comm);
        } catch (const Error&) {
        }
        Communicator three = comm.shrink();
        require(three.size() == 3 && three.rank() == comm.rank(), "shrunk to 3");
        sumIsRight(three);
        if (three.rank() == 0) return;  // leaves
        Communicator two = three.shrink({0});
        require(two.size() == 2, "shrunk to 2");
        sumIsRight(two);  // across the hosts: rank 1 on host 0, rank 2 on host 1
      },
      options);
}

// Network faults between two namespace hosts, in the middle of all-reduce
// loops over tcp (runNetworkFault), at every moment of faultMoments(): the
// link taken down; a silent partition (blackhole routes both ways: packets
// vanish, the link stays up); and host 1 torn down (its link deleted, then
// its rank killed, as a machine that loses power). Every surviving rank fails within the timeout
// plus 2 s, naming the other, and nothing hangs.
TEST(MultiHost, NetworkFaultsFailEverySurvivorNamingThePeerWithinTheTimeout) {
  for (const std::string kind : {"link down", "blackhole", "host torn down"})
    for (const auto moment : faultMoments("300,900,1700")) {
      NamespaceHosts hosts(2);
      if (!hosts.ready()) GTEST_SKIP() << hosts.why();
      // (Also the deadline of creating the communicator, on a loaded CI.)
      constexpr auto kTimeout = std::chrono::seconds(5);
      runNetworkFault(hosts, kind, moment,
                      onHosts(
                          hosts, [](int rank) { return rank; }, kTimeout, std::chrono::seconds(60)),
                      kTimeout, [](Communicator&) {});
      if (::testing::Test::HasFailure()) return;
    }
}

// Device buffers between hosts are staged through host memory over tcp;
// within a host they go through device memory both ranks map. Four ranks,
// two per host (ranks 0 and 2 on one, 1 and 3 on the other), so every
// collective mixes both paths and each ring step crosses hosts.
TEST(MultiHost, DeviceBuffersAcrossHostsAreStagedOverTcp) {
  NamespaceHosts hosts(2);
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  ::setenv("BRAID_DEVICE_SLOT_BYTES", "64K", 1);  // many slots in flight per op
  RunOptions options = onHosts(
      hosts, [](int rank) { return rank % 2; }, std::chrono::seconds(30),
      std::chrono::seconds(300));
  options.enter = [&](int rank) {
    hosts.enter(rank % 2);
    device::select("emulated");
  };
  runRanks(
      4,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        const std::vector<std::string> host = detail::peerTransports(comm);
        const std::vector<std::string> paths = detail::peerDevicePaths(comm);
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          const bool sameHost = p % 2 == r % 2;
          require(host[p] == (sameHost ? "shm" : "tcp"),
                  format("host buffers reach rank %d by %s", p, host[p].c_str()));
          require(
              paths[p] == (sameHost ? "cuda_ipc: same device" : "tcp: staged through host memory"),
              format("device buffers reach rank %d by '%s'", p, paths[p].c_str()));
        }
        TestStream stream(device::current()->current());
        uint64_t seed = 3;
        for (Coll coll : kAllColls)
          for (DataType type : {DataType::Int32, DataType::Float32, DataType::BFloat16})
            for (ReduceOp op : reduces(coll) ? std::vector<ReduceOp>{ReduceOp::Sum, ReduceOp::Max}
                                             : std::vector<ReduceOp>{ReduceOp::Sum})
              for (size_t count : {size_t{1}, size_t{1023}, (size_t{1} << 18) + 5})
                for (bool inPlace : {false, true}) {
                  const Case c{coll, type, op, count, inPlace, static_cast<int>(seed % n)};
                  const std::string problem = runCase(comm, stream, c, ++seed);
                  require(problem.empty(), problem);
                }

        // Grouped sends around the ring, each to the other host, 1 MiB and
        // an empty message.
        for (size_t count : {size_t{0}, size_t{1} << 18}) {
          std::vector<int32_t> mine(count), theirs(count, -1);
          for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(i * 31 + r);
          const int device = device::current()->current();
          DeviceBuffer send(device, count * 4), recv(device, count * 4);
          send.upload(mine.data());
          const int to = (r + 1) % n, from = (r + n - 1) % n;
          comm.groupStart();
          comm.send(send.data(), count, DataType::Int32, to, Stream::cuda(stream.handle()));
          comm.recv(recv.data(), count, DataType::Int32, from, Stream::cuda(stream.handle()));
          comm.groupEnd();
          stream.synchronize();
          std::vector<std::byte> got = recv.download();
          if (count) std::memcpy(theirs.data(), got.data(), count * 4);
          for (size_t i = 0; i < count; ++i)
            require(theirs[i] == static_cast<int32_t>(i * 31 + from),
                    format("element %zu from rank %d is %d", i, from, theirs[i]));
        }
      },
      options);
  ::unsetenv("BRAID_DEVICE_SLOT_BYTES");
}

}  // namespace
}  // namespace braid::testing
