#include "transports/wiring.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

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

bool carriesHost(const TableRow& row) {
  return row.entry.create && row.entry.reach != Reach::Self && row.entry.notBuilt.empty();
}

// The row of `order` that carries host buffers between `a` and `b`
// (a != b), or nullptr when none reaches.
const TableRow* chosen(const std::vector<const TableRow*>& order,
                       const bootstrap::Bootstrap& bootstrap, int a, int b) {
  for (const TableRow* row : order)
    if (canReach(row->entry, bootstrap, a, b)) return row;
  return nullptr;
}

// The rows BRAID_TRANSPORT names, in its order, each checked to be a
// transport built here that carries host buffers; or, for the automatic
// choice (`*automatic`), every row that carries host buffers or was left
// out of the build (its knob's ON is an error).
std::vector<const TableRow*> candidates(const Setup& setup, bool* automatic) {
  const std::vector<std::string> names = splitList(setup.knobs.transports);
  *automatic = names.empty();
  std::vector<const TableRow*> order;
  if (*automatic) {
    for (const TableRow& row : table())
      if (carriesHost(row) || (!row.entry.notBuilt.empty() && row.entry.useKnob))
        order.push_back(&row);
    return order;
  }
  std::string built;  // those BRAID_TRANSPORT may name
  for (const TableRow& row : table())
    if (carriesHost(row)) built += (built.empty() ? "" : ", ") + std::string(row.entry.name);
  for (const std::string& name : names) {
    const TableRow* found = nullptr;
    for (const TableRow& row : table())
      if (carriesHost(row) && name == row.entry.name) found = &row;
    if (!found)
      fail(ErrorCode::InvalidArgument, setup.bootstrap.rank(),
           format("BRAID_TRANSPORT names '%s', which is not a transport built into this "
                  "library (built: %s)",
                  name.c_str(), built.c_str()));
    order.push_back(found);
  }
  return order;
}

// Collective: `entry`'s use knob as the communicator resolved it, checked
// to be the same on every rank (each must take the same way).
TransportUse agreedUse(const Setup& setup, const TransportEntry& entry) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const TransportUse use = setup.knobs.*entry.use;
  std::vector<uint8_t> uses(static_cast<size_t>(bootstrap.size()));
  uses[static_cast<size_t>(bootstrap.rank())] = static_cast<uint8_t>(use);
  bootstrap.allGather(uses.data(), 1, setup.deadline);
  for (int r = 1; r < bootstrap.size(); ++r)
    if (uses[static_cast<size_t>(r)] != uses[0])
      fail(ErrorCode::InvalidArgument, bootstrap.rank(),
           format("%s is %s on rank 0 and %s on rank %d: every rank must set it alike",
                  entry.useKnob, transportUseName(static_cast<TransportUse>(uses[0])),
                  transportUseName(static_cast<TransportUse>(uses[static_cast<size_t>(r)])), r));
  return use;
}

// Collective: whether the automatic choice may try `entry` (one with a
// use knob) on this communicator. Throws where its knob is ON and it
// cannot be.
bool mayTry(const Setup& setup, const TransportEntry& entry, TransportUse* use) {
  *use = agreedUse(setup, entry);
  if (*use == TransportUse::Off) return false;
  if (!entry.notBuilt.empty()) {
    if (*use == TransportUse::On)
      fail(ErrorCode::SystemError, setup.bootstrap.rank(),
           format("%s is ON, and this library was built without %s (%s)", entry.useKnob, entry.name,
                  entry.notBuilt.c_str()));
    return false;
  }
  return !entry.everyRankCan || entry.everyRankCan(setup, *use);
}

// The peers of this rank that the rows of `order` carry, by row.
std::vector<int> peersTaking(const std::vector<const TableRow*>& order, const TableRow& row,
                             const bootstrap::Bootstrap& bootstrap) {
  std::vector<int> peers;
  for (int peer = 0; peer < bootstrap.size(); ++peer)
    if (peer != bootstrap.rank() && chosen(order, bootstrap, bootstrap.rank(), peer) == &row)
      peers.push_back(peer);
  return peers;
}

// Whether some pair of ranks takes the last row of `order`.
bool anyPairTakesLast(const std::vector<const TableRow*>& order,
                      const bootstrap::Bootstrap& bootstrap) {
  for (int a = 0; a < bootstrap.size(); ++a)
    for (int b = a + 1; b < bootstrap.size(); ++b)
      if (chosen(order, bootstrap, a, b) == order.back()) return true;
  return false;
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
  void announceFailure(int failedRank, GiveUpReason reason) override {
    for (auto& part : parts_) part->announceFailure(failedRank, reason);
  }
  void sayGoodbye() override {
    for (auto& part : parts_) part->sayGoodbye();
  }
  void keepMemory() override {
    for (auto& part : parts_) part->keepMemory();
  }
  size_t deviceBytes() const override {
    size_t bytes = 0;
    for (auto& part : parts_) bytes += part->deviceBytes();
    return bytes;
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

// The entry that carries device buffers between `a` and `b` (a == b: a
// rank and itself).
const TransportEntry& deviceEntry(const Wiring& hosts, const bootstrap::Bootstrap& bootstrap, int a,
                                  int b) {
  return *hostRow(hosts, bootstrap, a, b).deviceVia;
}

// This rank's peers (itself included) whose device buffers `entry`
// carries, in rank order; `*anyPair` whether it carries any pair's.
std::vector<int> devicePeers(const Wiring& hosts, const bootstrap::Bootstrap& bootstrap,
                             const TransportEntry& entry, bool* anyPair) {
  std::vector<int> peers;
  *anyPair = false;
  for (int a = 0; a < bootstrap.size(); ++a)
    for (int b = a; b < bootstrap.size(); ++b)
      if (&deviceEntry(hosts, bootstrap, a, b) == &entry) {
        *anyPair = true;
        if (a == bootstrap.rank()) peers.push_back(b);
        if (b == bootstrap.rank() && a != b) peers.push_back(a);
      }
  std::sort(peers.begin(), peers.end());
  return peers;
}

// The entry whose device buffers travel through memory both ranks map.
const TransportEntry& mappingEntry() {
  for (const TableRow& row : table())
    if (row.entry.mapWindow && row.entry.notBuilt.empty()) return row.entry;
  throw Error(ErrorCode::Internal, "transport table: no row maps device memory");
}

}  // namespace

Wiring wireUp(const Setup& setup) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const int rank = bootstrap.rank();
  const int nranks = bootstrap.size();
  bool automatic = false;
  const std::vector<const TableRow*> order = candidates(setup, &automatic);
  for (int peer = 0; peer < nranks; ++peer)
    if (peer != rank && !chosen(order, bootstrap, rank, peer))
      fail(ErrorCode::InvalidArgument, rank,
           format("BRAID_TRANSPORT '%s' has no transport that reaches peer %d",
                  setup.knobs.transports.c_str(), peer));

  Wiring wiring;
  wiring.mayTry.assign(table().size(), -1);
  wiring.connections.assign(nranks, nullptr);
  wiring.transportOf.assign(nranks, nullptr);
  wiring.entries.assign(nranks, nullptr);
  // Transports are created in the same order on every rank, each by every
  // rank (their set-up is collective) once any pair of ranks takes it,
  // also where it serves no peer of this rank.
  for (const TableRow* row : order) {
    const TransportEntry& entry = row->entry;
    std::vector<const TableRow*> tried = wiring.order;
    tried.push_back(row);
    if (!anyPairTakesLast(tried, bootstrap)) continue;
    TransportUse use = TransportUse::Auto;
    if (automatic && entry.useKnob) {
      const auto index = static_cast<size_t>(row - table().data());
      int8_t& may = wiring.mayTry[index];
      const int8_t parents = setup.parent ? setup.parent->wiring.mayTry[index] : -1;
      if (parents >= 0) {  // the same knobs, agreed by its ranks, a subset of which these are
        use = setup.knobs.*entry.use;
        may = parents;
      } else {
        may = mayTry(setup, entry, &use) ? 1 : 0;
      }
      if (!may) continue;
    }
    const std::vector<int> peers = peersTaking(tried, *row, bootstrap);
    std::string whyNot;
    std::unique_ptr<Transport> created = entry.create(setup, peers, &whyNot);
    if (!created) {
      if (!automatic)
        fail(ErrorCode::SystemError, rank,
             format("BRAID_TRANSPORT names %s, and %s", entry.name, whyNot.c_str()));
      if (use == TransportUse::On)
        fail(ErrorCode::SystemError, rank,
             format("%s is ON, and %s", entry.useKnob, whyNot.c_str()));
      BRAID_INFO(Init, "%s cannot carry this communicator (%s)", entry.name, whyNot.c_str());
      continue;
    }
    wiring.order = std::move(tried);
    if (peers.empty()) continue;
    for (int peer : peers) {
      wiring.connections[peer] = &created->connection(peer);
      wiring.transportOf[peer] = created.get();
      wiring.entries[peer] = &entry;
    }
    wiring.transports.push_back(std::move(created));
  }

  const TransportEntry& self = loopback().entry;
  std::string whyNot;
  std::unique_ptr<Transport> created = self.create(setup, {rank}, &whyNot);
  wiring.connections[rank] = &created->connection(rank);
  wiring.transportOf[rank] = created.get();
  wiring.entries[rank] = &self;
  wiring.transports.push_back(std::move(created));
  return wiring;
}

const TableRow& hostRow(const Wiring& hosts, const bootstrap::Bootstrap& bootstrap, int a, int b) {
  if (a != b)
    if (const TableRow* row = chosen(hosts.order, bootstrap, a, b)) return *row;
  return loopback();
}

uint32_t rowsUsed(const Wiring& hosts, const bootstrap::Bootstrap& bootstrap) {
  // A pair's row depends only on whether its two ranks share a host
  // (canReach): one pair of each kind stands for all.
  const auto& peers = bootstrap.table();
  const int n = static_cast<int>(peers.size());
  int sameHostA = -1, sameHostB = -1, otherHost = -1;
  std::unordered_map<std::string, int> firstOnHost;
  for (int r = 0; r < n; ++r) {
    const auto [first, isFirst] = firstOnHost.emplace(peers[r].hostId, r);
    if (!isFirst && sameHostA < 0) sameHostA = first->second, sameHostB = r;
    if (otherHost < 0 && peers[r].hostId != peers[0].hostId) otherHost = r;
  }
  auto bit = [](const TableRow& row) { return 1u << (&row - table().data()); };
  uint32_t used = bit(loopback());
  if (sameHostA >= 0) used |= bit(hostRow(hosts, bootstrap, sameHostA, sameHostB));
  if (otherHost >= 0) used |= bit(hostRow(hosts, bootstrap, 0, otherHost));
  return used;
}

LinkModels linkModels(uint32_t rows) {
  // The slowest kind of link any pair takes: the first row used across
  // hosts if any, else the first used within a host, else the loopback's.
  const TableRow* local = nullptr;
  const TableRow* network = nullptr;
  LinkModels models;
  for (size_t i = 0; i < table().size(); ++i) {
    if (!(rows & (1u << i))) continue;
    const TableRow& row = table()[i];
    if (row.entry.reach == Reach::SameHost && !local) local = &row;
    if (row.entry.reach == Reach::AnyHost && !network) network = &row;
    models.byAddress |= row.entry.byAddress;
  }
  const TableRow& slowest = network ? *network : local ? *local : loopback();
  models.host = slowest.entry.hostLink;
  models.mixed = local && network;
  if (models.mixed) {
    models.host.hostLatency = local->entry.hostLink.latency;
    models.host.hostBandwidth = local->entry.hostLink.bandwidth;
  }
  // Device buffers: staged between hosts where any pair is, else mapped.
  models.device = (network ? *network : loopback()).deviceVia->deviceLink;
  return models;
}

std::unique_ptr<DeviceTransport> wireDevice(const Setup& setup, const Wiring& hosts) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  std::vector<std::unique_ptr<DeviceTransport>> parts;
  // Each row's set-up is collective: every rank takes part once any pair
  // of ranks needs it, each knowing that from the bootstrap's table.
  for (const TableRow& row : table()) {
    if (!row.entry.createDevice) continue;
    bool anyPair = false;
    const std::vector<int> peers = devicePeers(hosts, bootstrap, row.entry, &anyPair);
    if (!anyPair) continue;
    std::string whyNot;
    std::unique_ptr<DeviceTransport> created = row.entry.createDevice(setup, peers, &whyNot);
    if (!created) fail(ErrorCode::SystemError, bootstrap.rank(), whyNot);
    if (!peers.empty()) parts.push_back(std::move(created));
  }
  if (parts.size() == 1) return std::move(parts.front());
  return std::make_unique<CombinedDeviceTransport>(std::move(parts), bootstrap.size());
}

std::unique_ptr<DeviceTransport> wireGraphDevice(const Setup& setup, const Wiring& hosts) {
  const TransportEntry& entry = mappingEntry();
  bool anyPair = false;
  std::string whyNot;
  std::unique_ptr<DeviceTransport> created =
      entry.createDevice(setup, devicePeers(hosts, setup.bootstrap, entry, &anyPair), &whyNot);
  if (!created) fail(ErrorCode::SystemError, setup.bootstrap.rank(), whyNot);
  return created;
}

std::vector<PeerWindow> mapWindow(const Setup& setup, const Wiring& hosts, void* base,
                                  size_t bytes) {
  const TransportEntry& entry = mappingEntry();
  bool anyPair = false;
  return entry.mapWindow(setup, devicePeers(hosts, setup.bootstrap, entry, &anyPair), base, bytes);
}

void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes) {
  mappingEntry().unmapWindow(device, windows, bytes);
}

}  // namespace braid::transport
