#include "transports/registry.h"

#include <dirent.h>

#include <algorithm>
#include <sstream>

#include "braid/error.h"
#include "core/errors.h"
#include "core/knobs.h"
#include "core/log.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"
#include "transports/self/self_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_device.h"
#include "transports/tcp/tcp_transport.h"
#if BRAID_HAVE_UCX
#include "transports/ucx/ucx_transport.h"
#endif
#if BRAID_HAVE_IBVERBS
#include "transports/ibverbs/ibverbs_device.h"
#include "transports/ibverbs/ibverbs_transport.h"
#endif

namespace braid::transport {
namespace {

bool isNetwork(const std::string& name) {
  return name == "tcp" || name == "ucx" || name == "ibverbs";
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Whether `name` can carry traffic between ranks `a` and `b`: the same
// answer whichever asks.
bool canReach(const std::string& name, const bootstrap::Bootstrap& bootstrap, int a, int b) {
  if (name == "shm")  // same host: same hostname, boot id and network namespace
    return bootstrap.table()[a].hostId == bootstrap.table()[b].hostId;
  // The network transports reach every peer that the bootstrap reached.
  return isNetwork(name);
}

std::vector<std::string> preferenceOrder(const std::string& preference) {
  std::vector<std::string> order = splitList(preference);
  if (order.empty()) order = {"shm", "tcp"};
  return order;
}

// The transport of `order` that carries host buffers between `a` and `b`
// (a != b), or "" when none reaches.
std::string chosen(const std::vector<std::string>& order, const bootstrap::Bootstrap& bootstrap,
                   int a, int b) {
  for (const std::string& name : order)
    if (canReach(name, bootstrap, a, b)) return name;
  return "";
}

// Whether some pair of ranks takes `name` for host buffers under `order`
// (every rank gives the same answer, from the table alone).
bool anyPairTakes(const std::vector<std::string>& order, const bootstrap::Bootstrap& bootstrap,
                  const std::string& name) {
  for (int a = 0; a < bootstrap.size(); ++a)
    for (int b = a + 1; b < bootstrap.size(); ++b)
      if (chosen(order, bootstrap, a, b) == name) return true;
  return false;
}

// The transport that carries host buffers between `a` and `b` once wireUp()
// made `hosts`: the automatic choice between hosts may have taken ucx or
// ibverbs where the table says tcp (every rank alike).
std::string hostTransport(const std::vector<std::string>& order, bool automatic,
                          const Wiring& hosts, const bootstrap::Bootstrap& bootstrap, int a,
                          int b) {
  const std::string name = chosen(order, bootstrap, a, b);
  return automatic && name == "tcp" ? hosts.acrossHosts : name;
}

// Device buffers go the way host buffers go: between ranks whose host
// buffers take shm, through device memory both map (cuda_ipc, nvlink_p2p);
// between ranks whose host buffers take ibverbs, over verbs; between ranks
// whose host buffers take tcp or ucx, staged over tcp. (tcp's device proxy
// opens connections of its own through the bootstrap listeners, whichever
// transport carries the host buffers; UCX as Debian builds it has no CUDA
// support to stage through.)
enum class DevicePath { Mapped, Ibverbs, Tcp };
DevicePath devicePath(const std::vector<std::string>& order, bool automatic, const Wiring& hosts,
                      const bootstrap::Bootstrap& bootstrap, int a, int b) {
  if (a == b) return DevicePath::Mapped;
  const std::string name = hostTransport(order, automatic, hosts, bootstrap, a, b);
  if (name == "ibverbs") return DevicePath::Ibverbs;
  return isNetwork(name) ? DevicePath::Tcp : DevicePath::Mapped;
}

// Whether device buffers between `a` and `b` leave device memory both map
// (the answer is the same for any automatic choice between hosts).
bool deviceOverNetwork(const std::vector<std::string>& order, const bootstrap::Bootstrap& bootstrap,
                       int a, int b) {
  return a != b && isNetwork(chosen(order, bootstrap, a, b));
}

// This rank's device connections from several transports, each serving
// some peers.
class CombinedDeviceTransport final : public DeviceTransport {
 public:
  CombinedDeviceTransport(std::vector<std::unique_ptr<DeviceTransport>> parts, int nranks)
      : parts_(std::move(parts)), byPeer_(nranks, nullptr) {
    for (int peer = 0; peer < nranks; ++peer)
      for (auto& part : parts_)
        if (!byPeer_[peer] && part->connection(peer)) byPeer_[peer] = part.get();
  }

  size_t slotBytes() const override { return parts_.front()->slotBytes(); }
  int slots() const override { return parts_.front()->slots(); }
  DeviceConnection* connection(int peer) override {
    return byPeer_[peer] ? byPeer_[peer]->connection(peer) : nullptr;
  }
  std::string path(int peer) const override {
    return byPeer_[peer] ? byPeer_[peer]->path(peer) : "none";
  }
  void enqueued() override {
    for (auto& part : parts_) part->enqueued();
  }
  void poll(std::vector<PeerNotice>* notices) override {
    for (auto& part : parts_) part->poll(notices);
  }
  void announceFailure(int failedRank, bool timedOut) override {
    for (auto& part : parts_) part->announceFailure(failedRank, timedOut);
  }
  void sayGoodbye() override {
    for (auto& part : parts_) part->sayGoodbye();
  }
  void keepMemory() override {
    for (auto& part : parts_) part->keepMemory();
  }
  void announceWaitingFor(int rank) override {
    for (auto& part : parts_) part->announceWaitingFor(rank);
  }
  int peerWaitsFor(int peer) const override {
    return byPeer_[peer] ? byPeer_[peer]->peerWaitsFor(peer) : -1;
  }
  std::string whyBroken(int peer) const override {
    return byPeer_[peer] ? byPeer_[peer]->whyBroken(peer) : "";
  }

 private:
  std::vector<std::unique_ptr<DeviceTransport>> parts_;
  std::vector<DeviceTransport*> byPeer_;
};

// The peers whose device buffers this rank reaches through mapped device
// memory (itself included).
std::vector<int> mappedPeers(const std::vector<std::string>& order,
                             const bootstrap::Bootstrap& bootstrap) {
  std::vector<int> peers;
  for (int peer = 0; peer < bootstrap.size(); ++peer)
    if (!deviceOverNetwork(order, bootstrap, bootstrap.rank(), peer)) peers.push_back(peer);
  return peers;
}

#if BRAID_HAVE_UCX
// Whether `sysfs`/class/infiniband lists a device (InfiniBand or RoCE).
bool hasRdmaDevice(const std::string& sysfs) {
  DIR* dir = ::opendir((sysfs + "/class/infiniband").c_str());
  if (!dir) return false;
  bool found = false;
  while (dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') found = true;
  ::closedir(dir);
  return found;
}
#endif

// BRAID_UCX or BRAID_IBVERBS as the communicator resolved it, checked to
// be the same on every rank (each must take the same way). Collective.
TransportUse agreedUse(const Setup& setup, std::optional<TransportUse> resolved, const char* knob) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const TransportUse use = resolved ? *resolved : parseTransportUse(knobText(knob), knob);
  std::vector<uint8_t> uses(static_cast<size_t>(bootstrap.size()));
  uses[static_cast<size_t>(bootstrap.rank())] = static_cast<uint8_t>(use);
  bootstrap.allGather(uses.data(), 1, setup.deadline);
  for (int r = 1; r < bootstrap.size(); ++r)
    if (uses[static_cast<size_t>(r)] != uses[0])
      fail(ErrorCode::InvalidArgument, bootstrap.rank(),
           format("%s is %s on rank 0 and %s on rank %d: every rank must set it alike", knob,
                  transportUseName(static_cast<TransportUse>(uses[0])),
                  transportUseName(static_cast<TransportUse>(uses[static_cast<size_t>(r)])), r));
  return use;
}

#if BRAID_HAVE_IBVERBS
// The ibverbs knobs, checked (Error(InvalidArgument) naming a bad one).
ibverbs::Options ibverbsOptions() {
  ibverbs::Options options;
  options.hca = knobText("BRAID_IB_HCA");
  options.gidIndex =
      static_cast<int>(parseInt(knobText("BRAID_IB_GID_INDEX"), "BRAID_IB_GID_INDEX"));
  options.timeout = static_cast<int>(parseInt(knobText("BRAID_IB_TIMEOUT"), "BRAID_IB_TIMEOUT"));
  options.retryCount =
      static_cast<int>(parseInt(knobText("BRAID_IB_RETRY_CNT"), "BRAID_IB_RETRY_CNT"));
  options.qpsPerConnection = static_cast<int>(
      parseInt(knobText("BRAID_IB_QPS_PER_CONNECTION"), "BRAID_IB_QPS_PER_CONNECTION"));
  options.sysfs = knobText("BRAID_SYSFS");
  options.fake = knobText("BRAID_IB_FAKE");
  options.fakeFault = knobText("BRAID_IB_FAKE_FAULT");
  options.gdr = parseTransportUse(knobText("BRAID_IB_GDR"), "BRAID_IB_GDR");
  ibverbs::validate(options);
  return options;
}
#endif

// The automatic choice between hosts, collective over the communicator:
// ibverbs where built and BRAID_IBVERBS allows it, if every rank has an
// active RDMA port and it starts on every rank; nullptr means the next
// choice (ucx, then tcp). `peers` are this rank's peers on other hosts.
std::unique_ptr<Transport> ibverbsAcrossHosts(const Setup& setup, const std::vector<int>& peers) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const int rank = bootstrap.rank();
  const TransportUse use = agreedUse(setup, setup.ibverbs, "BRAID_IBVERBS");
  if (use == TransportUse::Off) return nullptr;
#if BRAID_HAVE_IBVERBS
  const ibverbs::Options options = ibverbsOptions();
  const std::string why = ibverbs::probe(options);
  std::vector<uint8_t> usable(static_cast<size_t>(bootstrap.size()));
  usable[static_cast<size_t>(rank)] = why.empty() ? 1 : 0;
  bootstrap.allGather(usable.data(), 1, setup.deadline);
  for (int r = 0; r < bootstrap.size(); ++r)
    if (!usable[static_cast<size_t>(r)]) {
      if (r == rank) BRAID_INFO(Init, "ibverbs is not used: %s", why.c_str());
      if (use == TransportUse::On)
        fail(ErrorCode::SystemError, rank,
             r == rank ? format("BRAID_IBVERBS is ON, and %s", why.c_str())
                       : format("BRAID_IBVERBS is ON, and rank %d has no usable RDMA port", r));
      return nullptr;
    }
  std::string whyNot;
  std::unique_ptr<Transport> created = ibverbs::create(
      bootstrap, peers, setup.slotBytes, setup.slots, options, setup.deadline, &whyNot);
  if (created) return created;
  if (use == TransportUse::On)
    fail(ErrorCode::SystemError, rank, format("BRAID_IBVERBS is ON, and %s", whyNot.c_str()));
  BRAID_INFO(Init, "ibverbs cannot carry this communicator (%s)", whyNot.c_str());
  return nullptr;
#else
  (void)peers;
  if (use == TransportUse::On)
    fail(ErrorCode::SystemError, rank,
         "BRAID_IBVERBS is ON, and this library was built without ibverbs (BRAID_IBVERBS=OFF at "
         "build, or no libibverbs-dev)");
  return nullptr;
#endif
}

// ibverbs where BRAID_TRANSPORT names it: failing to start it is an error,
// on every rank alike.
std::unique_ptr<Transport> ibverbsAsked(const Setup& setup, const std::vector<int>& peers) {
#if BRAID_HAVE_IBVERBS
  std::string whyNot;
  std::unique_ptr<Transport> created =
      ibverbs::create(setup.bootstrap, peers, setup.slotBytes, setup.slots, ibverbsOptions(),
                      setup.deadline, &whyNot);
  if (!created)
    fail(ErrorCode::SystemError, setup.bootstrap.rank(),
         format("BRAID_TRANSPORT names ibverbs, and %s", whyNot.c_str()));
  return created;
#else
  (void)setup, (void)peers;
  return nullptr;  // (wireUp refuses an unbuilt transport first)
#endif
}

// The automatic choice between hosts, collective over the communicator:
// ucx where built and BRAID_UCX allows it (under AUTO: where every rank has
// an RDMA device), if UCX starts on every rank; nullptr means tcp. `peers`
// are this rank's peers on other hosts.
std::unique_ptr<Transport> ucxAcrossHosts(const Setup& setup, const std::vector<int>& peers) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const int rank = bootstrap.rank();
  const TransportUse use = agreedUse(setup, setup.ucx, "BRAID_UCX");
  if (use == TransportUse::Off) return nullptr;
#if BRAID_HAVE_UCX
  // AUTO takes ucx only over RDMA, on every rank: over plain TCP, UCX's tcp
  // measured slower than braid's own (README, "Performance across hosts").
  if (use == TransportUse::Auto) {
    std::vector<uint8_t> rdma(static_cast<size_t>(bootstrap.size()));
    rdma[static_cast<size_t>(rank)] = hasRdmaDevice(knobText("BRAID_SYSFS")) ? 1 : 0;
    bootstrap.allGather(rdma.data(), 1, setup.deadline);
    for (int r = 0; r < bootstrap.size(); ++r)
      if (!rdma[static_cast<size_t>(r)]) {
        BRAID_INFO(Init,
                   "ranks on different hosts use tcp: rank %d has no RDMA device, and over plain "
                   "TCP braid's tcp is faster than ucx (BRAID_UCX=ON takes ucx)",
                   r);
        return nullptr;
      }
  }
  std::string whyNot;
  std::unique_ptr<Transport> created =
      ucx::create(bootstrap, peers, setup.slotBytes, setup.slots, setup.deadline, &whyNot);
  if (created) return created;
  if (use == TransportUse::On)
    fail(ErrorCode::SystemError, rank, format("BRAID_UCX is ON, and %s", whyNot.c_str()));
  BRAID_INFO(Init, "ranks on different hosts use tcp: ucx cannot carry this communicator (%s)",
             whyNot.c_str());
  return nullptr;
#else
  (void)peers;
  if (use == TransportUse::On)
    fail(ErrorCode::SystemError, rank,
         "BRAID_UCX is ON, and this library was built without UCX (BRAID_UCX=OFF at build, or "
         "no libucx-dev)");
  return nullptr;
#endif
}

// ucx where BRAID_TRANSPORT names it: failing to start it is an error, on
// every rank alike.
std::unique_ptr<Transport> ucxAsked(const Setup& setup, const std::vector<int>& peers) {
#if BRAID_HAVE_UCX
  std::string whyNot;
  std::unique_ptr<Transport> created =
      ucx::create(setup.bootstrap, peers, setup.slotBytes, setup.slots, setup.deadline, &whyNot);
  if (!created)
    fail(ErrorCode::SystemError, setup.bootstrap.rank(),
         format("BRAID_TRANSPORT names ucx, and %s", whyNot.c_str()));
  return created;
#else
  (void)setup, (void)peers;
  return nullptr;  // (wireUp refuses an unbuilt transport first)
#endif
}

}  // namespace

std::vector<std::string> builtTransports() {
  std::vector<std::string> built = {"self", "shm", "tcp"};
  if (BRAID_HAVE_UCX) built.push_back("ucx");
  if (BRAID_HAVE_IBVERBS) built.push_back("ibverbs");
  return built;
}

std::string ibverbsStatus() {
#if BRAID_HAVE_IBVERBS
  try {
    return ibverbs::probe(ibverbsOptions());
  } catch (const Error& error) {
    return error.what();
  }
#else
  return "not built (BRAID_IBVERBS=OFF at build, or no libibverbs-dev)";
#endif
}

Wiring wireUp(const Setup& setup, const std::string& preference) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const int rank = bootstrap.rank();
  const int nranks = bootstrap.size();
  const std::vector<std::string> order = preferenceOrder(preference);
  const bool automatic = splitList(preference).empty();
  const std::vector<std::string> built = builtTransports();
  std::string builtList;  // those BRAID_TRANSPORT may name
  for (const std::string& name : built)
    if (name != "self") builtList += (builtList.empty() ? "" : ", ") + name;
  for (const std::string& name : order) {
    if (std::find(built.begin(), built.end(), name) == built.end() || name == "self")
      fail(ErrorCode::InvalidArgument, rank,
           format("BRAID_TRANSPORT names '%s', which is not a transport built into this "
                  "library (built: %s)",
                  name.c_str(), builtList.c_str()));
  }

  Wiring wiring;
  wiring.connections.assign(nranks, nullptr);
  wiring.names.assign(nranks, "");
  std::vector<std::vector<int>> peersOf(order.size());
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    const size_t choice = static_cast<size_t>(
        std::find(order.begin(), order.end(), chosen(order, bootstrap, rank, peer)) -
        order.begin());
    if (choice == order.size())
      fail(ErrorCode::InvalidArgument, rank,
           format("BRAID_TRANSPORT '%s' has no transport that reaches peer %d", preference.c_str(),
                  peer));
    peersOf[choice].push_back(peer);
  }

  // Transports are created in the same order on every rank, each by every
  // rank (their set-up is collective), even where it serves no peer here;
  // ucx only where some pair takes it (its set-up costs a worker per rank).
  for (size_t i = 0; i < order.size(); ++i) {
    std::unique_ptr<Transport> created;
    if (order[i] == "tcp" && automatic && anyPairTakes(order, bootstrap, "tcp")) {
      created = ibverbsAcrossHosts(setup, peersOf[i]);
      if (!created) created = ucxAcrossHosts(setup, peersOf[i]);
      if (created) wiring.acrossHosts = created->name();
    }
    if (order[i] == "tcp" && !created)
      created = tcp::create(bootstrap, peersOf[i], setup.slotBytes, setup.slots, setup.sockets,
                            setup.deadline);
    if (order[i] == "ucx") {
      if (!anyPairTakes(order, bootstrap, "ucx")) continue;
      created = ucxAsked(setup, peersOf[i]);
    }
    if (order[i] == "ibverbs") {
      if (!anyPairTakes(order, bootstrap, "ibverbs")) continue;
      created = ibverbsAsked(setup, peersOf[i]);
    }
    if (order[i] == "shm")
      created = shm::create(bootstrap, peersOf[i], setup.slotBytes, setup.slots, setup.deadline);
    if (peersOf[i].empty()) continue;
    for (int peer : peersOf[i]) {
      wiring.connections[peer] = &created->connection(peer);
      wiring.names[peer] = created->name();
    }
    wiring.transports.push_back(std::move(created));
  }
  auto loopback = self::create(rank, setup.slotBytes, setup.slots);
  wiring.connections[rank] = &loopback->connection(rank);
  wiring.names[rank] = loopback->name();
  wiring.transports.push_back(std::move(loopback));
  return wiring;
}

std::unique_ptr<DeviceTransport> wireDevice(const Setup& setup, const std::string& preference,
                                            const Wiring& hosts, device::Device& device,
                                            int deviceIndex) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const std::vector<std::string> order = preferenceOrder(preference);
  const bool automatic = splitList(preference).empty();
  std::vector<std::unique_ptr<DeviceTransport>> parts;
  parts.push_back(cuda_ipc::create(bootstrap, mappedPeers(order, bootstrap), device, deviceIndex,
                                   setup.slotBytes, setup.slots, setup.deadline));
  // Each network transport's set-up is collective: every rank takes part
  // once any pair of ranks needs it, each knowing that from the table.
  for (const DevicePath way : {DevicePath::Ibverbs, DevicePath::Tcp}) {
    std::vector<int> peers;
    bool anyPair = false;
    for (int a = 0; a < bootstrap.size(); ++a)
      for (int b = a + 1; b < bootstrap.size(); ++b)
        if (devicePath(order, automatic, hosts, bootstrap, a, b) == way) {
          anyPair = true;
          if (a == bootstrap.rank()) peers.push_back(b);
          if (b == bootstrap.rank()) peers.push_back(a);
        }
    if (!anyPair) continue;
    std::sort(peers.begin(), peers.end());
    std::unique_ptr<DeviceTransport> created;
    if (way == DevicePath::Tcp)
      created = tcp::createDevice(bootstrap, peers, device, deviceIndex, setup.slotBytes,
                                  setup.slots, setup.deadline);
#if BRAID_HAVE_IBVERBS
    if (way == DevicePath::Ibverbs)
      created = ibverbs::createDevice(bootstrap, peers, device, deviceIndex, setup.slotBytes,
                                      setup.slots, ibverbsOptions(), setup.deadline);
#endif
    if (created && !peers.empty()) parts.push_back(std::move(created));
  }
  if (parts.size() == 1) return std::move(parts.front());
  return std::make_unique<CombinedDeviceTransport>(std::move(parts), bootstrap.size());
}

std::unique_ptr<DeviceTransport> wireGraphDevice(const Setup& setup, const std::string& preference,
                                                 device::Device& device, int deviceIndex) {
  return cuda_ipc::create(setup.bootstrap,
                          mappedPeers(preferenceOrder(preference), setup.bootstrap), device,
                          deviceIndex, setup.slotBytes, setup.slots, setup.deadline);
}

std::vector<PeerWindow> mapWindow(const Setup& setup, const std::string& preference,
                                  device::Device& device, int deviceIndex, void* base,
                                  size_t bytes) {
  return cuda_ipc::mapWindow(setup.bootstrap,
                             mappedPeers(preferenceOrder(preference), setup.bootstrap), device,
                             deviceIndex, base, bytes, setup.deadline);
}

void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes) {
  cuda_ipc::unmapWindow(device, windows, bytes);
}

}  // namespace braid::transport
