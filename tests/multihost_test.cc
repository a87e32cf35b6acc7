// Ranks on two "hosts": two network namespaces joined by a veth pair, with
// loopback-range addresses (127.77.0.1 and 127.77.0.2) routed across it. The
// test makes the namespaces itself and removes them; it skips when it cannot
// (not root, no `ip`, no namespace support). A rank that also takes a
// hostname of its own (a UTS namespace) is on another host as braid sees
// it: no shared memory or device memory mapping with the other host.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "device/device.h"
#include "device_cases.h"
#include "multirank.h"

namespace braid::testing {
namespace {

bool run(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Two namespaces "<prefix>a" and "<prefix>b", each with one end of a veth
// pair named "bra"/"brb" holding 127.77.0.1/24 and 127.77.0.2/24.
class TwoHosts {
 public:
  TwoHosts() : prefix_("braid" + std::to_string(::getpid())) {
    if (::geteuid() != 0) {
      why_ = "needs root to create network namespaces";
      return;
    }
    const std::string a = prefix_ + "a", b = prefix_ + "b";
    std::vector<std::string> steps = {
        "ip netns add " + a,
        "ip netns add " + b,
        "ip link add bra netns " + a + " type veth peer name brb netns " + b,
    };
    for (const std::string& ns : {a, b}) {
      std::string dev = ns == a ? "bra" : "brb";
      std::string address = ns == a ? "127.77.0.1/24" : "127.77.0.2/24";
      steps.push_back("ip netns exec " + ns + " ip link set lo up");
      steps.push_back("ip netns exec " + ns + " sysctl -qw net.ipv4.conf.all.route_localnet=1");
      steps.push_back("ip netns exec " + ns + " sysctl -qw net.ipv4.conf." + dev +
                      ".route_localnet=1");
      steps.push_back("ip netns exec " + ns + " ip addr add " + address + " dev " + dev);
      steps.push_back("ip netns exec " + ns + " ip link set " + dev + " up");
    }
    for (const std::string& step : steps) {
      if (!run(step)) {
        why_ = "could not set up network namespaces (" + step + ")";
        return;
      }
    }
    ready_ = probe();
    if (!ready_) why_ = "the veth pair does not carry loopback-range traffic here";
  }
  ~TwoHosts() {
    run("ip netns del " + prefix_ + "a");
    run("ip netns del " + prefix_ + "b");
  }

  bool ready() const { return ready_; }
  const std::string& why() const { return why_; }

  // Moves the calling thread into host 0 ("a") or 1 ("b").
  void enter(int host) const {
    std::string path = "/var/run/netns/" + prefix_ + (host == 0 ? "a" : "b");
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    require(fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0, "cannot enter " + path);
    ::close(fd);
  }

  // Also gives the calling process host `host`'s own hostname, so that
  // braid's host identity (hostname + boot id) tells the two apart.
  void becomeHost(int host) const {
    enter(host);
    const std::string name = prefix_ + (host == 0 ? "-host-a" : "-host-b");
    require(::unshare(CLONE_NEWUTS) == 0 && ::sethostname(name.data(), name.size()) == 0,
            "cannot take hostname " + name);
  }

  // Runs `body` inside host `host`, then returns to this process's own
  // namespace. Sockets made inside stay in that host.
  template <typename Body>
  void inside(int host, Body body) const {
    int home = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    require(home >= 0, "cannot open /proc/self/ns/net");
    enter(host);
    body();
    require(::setns(home, CLONE_NEWNET) == 0, "cannot return to the home namespace");
    ::close(home);
  }

 private:
  // One TCP connection from host a to host b.
  bool probe() const {
    try {
      std::optional<net::Listener> listener;
      inside(1, [&] { listener.emplace(net::Address::parse("127.77.0.2:0", "probe")); });
      bool connected = false;
      inside(0, [&] {
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        connected = net::Socket::connect(listener->address(), deadline, "probe").valid();
      });
      return connected;
    } catch (const std::exception&) {
      return false;
    } catch (const RankFailure&) {
      return false;
    }
  }

  std::string prefix_;
  std::string why_;
  bool ready_ = false;
};

TEST(MultiHost, CollectivesAcrossTwoNetworkNamespacesOverTcp) {
  TwoHosts hosts;
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();

  // The root lives in rank 0, inside host 0.
  RunOptions options;
  options.idConfig = Config{};
  options.idConfig->socketIfname = "bra";
  options.config.socketIfname = "";  // each rank uses the interface that routes to the root
  options.config.transports = "tcp";
  options.config.timeout = std::chrono::seconds(30);
  options.deadline = std::chrono::seconds(60);
  options.enter = [&](int rank) { hosts.enter(rank % 2); };
  runRanks(
      4,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        auto names = detail::peerTransports(comm);
        for (int p = 0; p < n; ++p)
          require(names[p] == (p == r ? "self" : "tcp"), "every peer is reached over tcp");
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
  TwoHosts hosts;
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  RunOptions options;
  options.idConfig = Config{};
  options.idConfig->socketIfname = "bra";
  options.config.transports = "tcp";  // the namespaces share one kernel, so shm would work too
  options.enter = [&](int rank) { hosts.enter(rank); };
  runProcesses(
      2,
      [](int rank, const UniqueId& id, const Config& base) {
        Config config = base;
        config.socketIfname = rank == 0 ? "bra" : "brb";
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

// Device buffers between hosts are staged through host memory over tcp;
// within a host they go through device memory both ranks map. Four ranks,
// two per host (ranks 0 and 2 on one, 1 and 3 on the other), so every
// collective mixes both paths and each ring step crosses hosts.
TEST(MultiHost, DeviceBuffersAcrossHostsAreStagedOverTcp) {
  TwoHosts hosts;
  if (!hosts.ready()) GTEST_SKIP() << hosts.why();
  ::setenv("BRAID_DEVICE_SLOT_BYTES", "64K", 1);  // many slots in flight per op
  RunOptions options;
  options.idConfig = Config{};
  options.idConfig->socketIfname = "bra";
  options.config.socketIfname = "";
  options.config.timeout = std::chrono::seconds(30);
  options.deadline = std::chrono::seconds(300);
  options.enter = [&](int rank) {
    hosts.becomeHost(rank % 2);
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
