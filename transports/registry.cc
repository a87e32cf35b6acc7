#include "transports/registry.h"

#include <algorithm>
#include <sstream>

#include "braid/error.h"
#include "core/errors.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"
#include "transports/self/self_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_device.h"
#include "transports/tcp/tcp_transport.h"

namespace braid::transport {
namespace {

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
  return name == "tcp";  // tcp reaches every peer that the bootstrap reached
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

// Device buffers go the way host buffers go: between ranks whose host
// buffers take shm, through device memory both map (cuda_ipc, nvlink_p2p);
// between ranks whose host buffers take tcp, staged over tcp.
bool deviceOverTcp(const std::vector<std::string>& order, const bootstrap::Bootstrap& bootstrap,
                   int a, int b) {
  return a != b && chosen(order, bootstrap, a, b) == "tcp";
}

// This rank's device connections from two transports, each serving some
// peers.
class CombinedDeviceTransport final : public DeviceTransport {
 public:
  CombinedDeviceTransport(std::unique_ptr<DeviceTransport> first,
                          std::unique_ptr<DeviceTransport> second, int nranks)
      : first_(std::move(first)), second_(std::move(second)), byPeer_(nranks, nullptr) {
    for (int peer = 0; peer < nranks; ++peer)
      byPeer_[peer] = first_->connection(peer)    ? first_.get()
                      : second_->connection(peer) ? second_.get()
                                                  : nullptr;
  }

  size_t slotBytes() const override { return first_->slotBytes(); }
  int slots() const override { return first_->slots(); }
  DeviceConnection* connection(int peer) override {
    return byPeer_[peer] ? byPeer_[peer]->connection(peer) : nullptr;
  }
  std::string path(int peer) const override {
    return byPeer_[peer] ? byPeer_[peer]->path(peer) : "none";
  }
  void enqueued() override {
    first_->enqueued();
    second_->enqueued();
  }
  void poll(std::vector<PeerNotice>* notices) override {
    first_->poll(notices);
    second_->poll(notices);
  }
  void announceFailure(int failedRank, bool timedOut) override {
    first_->announceFailure(failedRank, timedOut);
    second_->announceFailure(failedRank, timedOut);
  }
  void sayGoodbye() override {
    first_->sayGoodbye();
    second_->sayGoodbye();
  }
  void keepMemory() override {
    first_->keepMemory();
    second_->keepMemory();
  }
  void announceWaitingFor(int rank) override {
    first_->announceWaitingFor(rank);
    second_->announceWaitingFor(rank);
  }
  int peerWaitsFor(int peer) const override {
    return byPeer_[peer] ? byPeer_[peer]->peerWaitsFor(peer) : -1;
  }

 private:
  std::unique_ptr<DeviceTransport> first_, second_;
  std::vector<DeviceTransport*> byPeer_;
};

// The peers whose device buffers this rank reaches through mapped device
// memory (itself included).
std::vector<int> mappedPeers(const std::vector<std::string>& order,
                             const bootstrap::Bootstrap& bootstrap) {
  std::vector<int> peers;
  for (int peer = 0; peer < bootstrap.size(); ++peer)
    if (!deviceOverTcp(order, bootstrap, bootstrap.rank(), peer)) peers.push_back(peer);
  return peers;
}

}  // namespace

std::vector<std::string> builtTransports() { return {"self", "shm", "tcp"}; }

Wiring wireUp(const Setup& setup, const std::string& preference) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const int rank = bootstrap.rank();
  const int nranks = bootstrap.size();
  const std::vector<std::string> order = preferenceOrder(preference);
  const std::vector<std::string> built = builtTransports();
  for (const std::string& name : order) {
    if (std::find(built.begin(), built.end(), name) == built.end() || name == "self")
      fail(ErrorCode::InvalidArgument, rank,
           format("BRAID_TRANSPORT names '%s', which is not a transport built into this "
                  "library (built: shm, tcp)",
                  name.c_str()));
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
  // rank (their set-up is collective), even where it serves no peer here.
  for (size_t i = 0; i < order.size(); ++i) {
    std::unique_ptr<Transport> created;
    if (order[i] == "tcp")
      created = tcp::create(bootstrap, peersOf[i], setup.slotBytes, setup.slots, setup.deadline);
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
                                            device::Device& device, int deviceIndex) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const std::vector<std::string> order = preferenceOrder(preference);
  auto mapped = cuda_ipc::create(bootstrap, mappedPeers(order, bootstrap), device, deviceIndex,
                                 setup.slotBytes, setup.slots, setup.deadline);
  // tcp's set-up is collective: every rank takes part once any pair of
  // ranks needs it, each knowing that from the table alone.
  std::vector<int> staged;
  bool anyPair = false;
  for (int a = 0; a < bootstrap.size(); ++a)
    for (int b = a + 1; b < bootstrap.size(); ++b)
      if (deviceOverTcp(order, bootstrap, a, b)) {
        anyPair = true;
        if (a == bootstrap.rank()) staged.push_back(b);
        if (b == bootstrap.rank()) staged.push_back(a);
      }
  if (!anyPair) return mapped;
  std::sort(staged.begin(), staged.end());
  auto overTcp =
      tcp::createDevice(bootstrap, staged, device, setup.slotBytes, setup.slots, setup.deadline);
  if (staged.empty()) return mapped;
  return std::make_unique<CombinedDeviceTransport>(std::move(mapped), std::move(overTcp),
                                                   bootstrap.size());
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
