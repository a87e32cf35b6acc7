#include "transports/registry.h"

#include <algorithm>
#include <sstream>

#include "braid/error.h"
#include "core/errors.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"
#include "transports/self/self_transport.h"
#include "transports/shm/shm_transport.h"
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

// Whether `name` can carry traffic between this rank and `peer`. The answer
// must be the same seen from both ends.
bool canReach(const std::string& name, const bootstrap::Bootstrap& bootstrap, int peer) {
  if (name == "shm")  // same host: same hostname and boot id
    return bootstrap.table()[peer].hostId == bootstrap.table()[bootstrap.rank()].hostId;
  return name == "tcp";  // tcp reaches every peer that the bootstrap reached
}

}  // namespace

std::vector<std::string> builtTransports() { return {"self", "shm", "tcp"}; }

Wiring wireUp(const Setup& setup, const std::string& preference) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const int rank = bootstrap.rank();
  const int nranks = bootstrap.size();
  std::vector<std::string> order = splitList(preference);
  if (order.empty()) order = {"shm", "tcp"};
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
    size_t choice = 0;
    while (choice < order.size() && !canReach(order[choice], bootstrap, peer)) ++choice;
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

std::unique_ptr<DeviceTransport> wireDevice(const Setup& setup, device::Device& device,
                                            int deviceIndex) {
  return cuda_ipc::create(setup.bootstrap, device, deviceIndex, setup.slotBytes, setup.slots,
                          setup.deadline);
}

std::vector<PeerWindow> mapWindow(const Setup& setup, device::Device& device, int deviceIndex,
                                  void* base, size_t bytes) {
  return cuda_ipc::mapWindow(setup.bootstrap, device, deviceIndex, base, bytes, setup.deadline);
}

void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes) {
  cuda_ipc::unmapWindow(device, windows, bytes);
}

}  // namespace braid::transport
