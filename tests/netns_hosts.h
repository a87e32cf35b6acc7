// "Hosts" for multi-host tests on one machine: network namespaces joined
// through a bridge. Host i is namespace "<prefix>h<i>" with one end of a
// veth pair ("eth0", 127.77.0.<i+1>/24, loopback-range addresses routed
// across it); the other ends sit on a bridge in namespace "<prefix>br".
// braid's host identity includes the network namespace, so ranks in
// different namespace hosts are on different hosts as braid sees it (no
// shm or device memory mapping between them) although they share the
// kernel, the IPC namespace and /dev/shm.
//
// The harness makes the namespaces itself and removes them all when it
// goes; it reports why it cannot (not root, no `ip`, no namespace or
// bridge support) and the test then skips saying so.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.h"
#include "core/errors.h"
#include "multirank.h"

namespace braid::testing {

class NamespaceHosts {
 public:
  explicit NamespaceHosts(int hosts)
      : prefix_("braid" + std::to_string(::getpid())), hosts_(hosts) {
    if (::geteuid() != 0) {
      why_ = "needs root to create network namespaces";
      return;
    }
    const std::string bridge = prefix_ + "br";
    std::vector<std::string> steps = {
        "ip netns add " + bridge,
        "ip netns exec " + bridge + " ip link add br0 type bridge",
        "ip netns exec " + bridge + " ip link set br0 up",
    };
    for (int h = 0; h < hosts; ++h) {
      const std::string ns = name(h), port = "p" + std::to_string(h);
      steps.push_back("ip netns add " + ns);
      steps.push_back("ip link add eth0 netns " + ns + " type veth peer name " + port + " netns " +
                      bridge);
      steps.push_back("ip netns exec " + bridge + " ip link set " + port + " master br0");
      steps.push_back("ip netns exec " + bridge + " ip link set " + port + " up");
      steps.push_back("ip netns exec " + ns + " ip link set lo up");
      steps.push_back("ip netns exec " + ns + " sysctl -qw net.ipv4.conf.all.route_localnet=1");
      steps.push_back("ip netns exec " + ns + " sysctl -qw net.ipv4.conf.eth0.route_localnet=1");
      steps.push_back("ip netns exec " + ns + " ip addr add " + address(h) + "/24 dev eth0");
      steps.push_back("ip netns exec " + ns + " ip link set eth0 up");
    }
    for (const std::string& step : steps) {
      if (!run(step)) {
        why_ = "could not set up network namespaces (" + step + ")";
        return;
      }
    }
    ready_ = probe();
    if (!ready_) why_ = "the bridge does not carry loopback-range traffic between namespaces here";
  }
  ~NamespaceHosts() {
    for (int h = 0; h < hosts_; ++h) run("ip netns del " + name(h));
    run("ip netns del " + prefix_ + "br");
  }
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  bool ready() const { return ready_; }
  const std::string& why() const { return why_; }
  int size() const { return hosts_; }
  std::string name(int host) const { return prefix_ + "h" + std::to_string(host); }
  // Host `host`'s address, e.g. "127.77.0.1".
  static std::string address(int host) { return "127.77.0." + std::to_string(host + 1); }

  // Moves the calling thread (a forked rank: its process) into `host`.
  void enter(int host) const {
    const std::string path = "/var/run/netns/" + name(host);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    require(fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0, "cannot enter " + path);
    ::close(fd);
  }

  // Runs `body` inside `host`, then returns to this thread's own
  // namespace. Sockets made inside stay in that host.
  template <typename Body>
  void inside(int host, Body body) const {
    const int home = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    require(home >= 0, "cannot open /proc/self/ns/net");
    enter(host);
    body();
    require(::setns(home, CLONE_NEWNET) == 0, "cannot return to the home namespace");
    ::close(home);
  }

 private:
  static bool run(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }

  // A TCP connection from the first host to every other.
  bool probe() const {
    try {
      for (int h = 1; h < hosts_; ++h) {
        std::optional<net::Listener> listener;
        inside(h, [&] { listener.emplace(net::Address::parse(address(h) + ":0", "probe")); });
        bool connected = false;
        inside(0, [&] {
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
          connected = net::Socket::connect(listener->address(), deadline, "probe").valid();
        });
        if (!connected) return false;
      }
      return true;
    } catch (const std::exception&) {
      return false;
    } catch (const RankFailure&) {
      return false;
    }
  }

  std::string prefix_;
  int hosts_;
  std::string why_;
  bool ready_ = false;
};

// The moments at which a fault test strikes, in ms after its ranks loop:
// BRAID_FAULT_MOMENTS_MS (a comma list; the full run is
// 100,300,900,1700,2600), else `byDefault`.
inline std::vector<std::chrono::milliseconds> faultMoments(const std::string& byDefault) {
  const char* env = std::getenv("BRAID_FAULT_MOMENTS_MS");
  const std::string list = env && *env ? env : byDefault;
  std::vector<std::chrono::milliseconds> moments;
  for (size_t at = 0; at < list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    moments.emplace_back(std::stoll(list.substr(at, comma - at)));
    at = comma + 1;
  }
  return moments;
}

// One network fault between two namespace hosts (one rank each) in the
// middle of all-reduce loops: `kind` ("link down"; "blackhole": routes
// both ways, packets vanish and the link stays up; "host torn down": host
// 1's link deleted, then its rank killed, as a machine that loses power)
// strikes `moment` after both ranks loop (creation, with its calibration,
// takes longer under the sanitizers). Every surviving rank must fail
// within `timeout` (the ranks' Config::timeout) plus 2 s, naming the
// other. `check` runs first in each rank (e.g. that the pair takes the
// transport under test). `options` enter the ranks into `hosts`.
inline void runNetworkFault(NamespaceHosts& hosts, const std::string& kind,
                            std::chrono::milliseconds moment, RunOptions options,
                            std::chrono::milliseconds timeout,
                            const std::function<void(Communicator&)>& check) {
  struct Flags {
    std::atomic<int> looping;  // ranks past their first all-reduce
    std::atomic<int> torn;     // host 1's link is gone
  };
  const std::string label = kind + format(" at %lld ms", static_cast<long long>(moment.count()));
  SharedWithRanks<Flags> flags;
  std::atomic<int>* torn = &flags->torn;
  std::atomic<int>* looping = &flags->looping;
  if (kind == "host torn down") options.killed = {1};
  // The fault strikes from a process of its own: a thread here would make
  // the ranks forked next children of a multi-threaded process, which
  // ThreadSanitizer cannot follow.
  std::fflush(nullptr);
  const pid_t fault = ::fork();
  if (fault < 0) throw std::runtime_error("fork of the fault process failed");
  if (fault == 0) {
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (looping->load() < 2 && std::chrono::steady_clock::now() < giveUp)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(moment);
    auto in = [&](int h, const std::string& command) {
      return std::system(("ip netns exec " + hosts.name(h) + " " + command).c_str());
    };
    if (kind == "link down") {
      in(1, "ip link set eth0 down");
    } else if (kind == "blackhole") {
      for (int h = 0; h < 2; ++h)
        in(h, "ip route add blackhole " + NamespaceHosts::address(1 - h) + "/32");
    } else {
      in(1, "ip link del eth0");
      torn->store(1);
    }
    ::_exit(0);
  }
  runRanks(
      2,
      [&](Communicator& comm) {
        check(comm);
        const int peer = 1 - comm.rank();
        if (kind == "host torn down" && comm.rank() == 1)
          std::thread([torn] {
            while (torn->load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ::kill(::getpid(), SIGKILL);
          }).detach();
        std::vector<float> in(1 << 16, 1.0f), out(1 << 16);
        const auto start = std::chrono::steady_clock::now();
        auto lastGood = start;
        try {
          for (;;) {
            comm.allReduce(in.data(), out.data(), in.size(), DataType::Float32, ReduceOp::Sum);
            require(out[100] == 2.0f, label + ": a wrong sum before the fault");
            if (lastGood == start) looping->fetch_add(1);
            lastGood = std::chrono::steady_clock::now();
            require(lastGood - start < std::chrono::seconds(30), label + ": no fault came");
          }
        } catch (const Error& error) {
          const auto failedAfter = std::chrono::steady_clock::now() - lastGood;
          const std::string what = error.what();
          require(what.find(format("rank %d", peer)) != std::string::npos ||
                      what.find(format("peer %d", peer)) != std::string::npos,
                  label + ": the error does not name rank " + std::to_string(peer) + ": " + what);
          require(failedAfter < timeout + std::chrono::seconds(2),
                  format("%s: failed %.2f s after the last good op", label.c_str(),
                         std::chrono::duration<double>(failedAfter).count()));
        }
      },
      options);
  ::waitpid(fault, nullptr, 0);
}

}  // namespace braid::testing
