#include "core/introspect.h"

#include "core/communicator_impl.h"
#include "core/errors.h"

namespace braid {

namespace detail {

std::vector<std::string> peerTransports(const Communicator& comm) {
  if (!comm.impl()) return {};
  std::vector<std::string> names;
  for (const transport::TransportEntry* entry : comm.impl()->wiring.entries)
    names.push_back(entry->name);
  return names;
}

std::vector<uint64_t> stripePosts(const Communicator& comm, int peer) {
  if (!comm.impl() || peer < 0 || peer >= comm.size()) return {};
  return comm.impl()->wiring.connections[peer]->stripePosts();
}

std::vector<std::string> peerDevicePaths(const Communicator& comm) {
  const Communicator::Impl* impl = comm.impl();
  if (!impl || !impl->device) return {};
  std::vector<std::string> paths;
  for (int peer = 0; peer < impl->nranks; ++peer) {
    if (!impl->deviceExecutor) {
      paths.push_back("none");
      continue;
    }
    const transport::DeviceTransport& transport = impl->deviceExecutor->transport();
    paths.push_back(transport.path(peer));
  }
  return paths;
}

std::vector<std::string> builtTransports() { return transport::builtTransports(); }
std::string transportStatus(const std::string& name) {
  const transport::TransportEntry* entry = transport::find(name);
  if (!entry) return format("no transport is named '%s'", name.c_str());
  if (!entry->notBuilt.empty()) return "not built (" + entry->notBuilt + ")";
  try {
    return entry->unusableHere ? entry->unusableHere() : "";
  } catch (const Error& error) {
    return error.what();
  }
}

std::string lastAlgorithm(const Communicator& comm) {
  return comm.impl() ? algo::algorithmName(comm.impl()->plans.lastAlgorithm()) : "";
}

std::string lastDeviceAlgorithm(const Communicator& comm) {
  return comm.impl() ? algo::algorithmName(comm.impl()->devicePlans.lastAlgorithm()) : "";
}

bool tuningLink(const Communicator& comm, algo::LinkModel* link) {
  const algo::LinkModel* model = comm.impl() ? comm.impl()->plans.model() : nullptr;
  if (model) *link = *model;
  return model != nullptr;
}

uint64_t piecesSentByReference(const Communicator& comm) {
  return comm.impl() ? comm.impl()->executor->piecesSentByReference() : 0;
}

uint64_t piecesStreamedToSlots(const Communicator& comm) {
  return comm.impl() ? comm.impl()->executor->piecesStreamedToSlots() : 0;
}

uint64_t piecesSentByAddress(const Communicator& comm) {
  return comm.impl() ? comm.impl()->executor->piecesSentByAddress() : 0;
}

size_t addressFrom(const Communicator& comm) {
  if (!comm.impl() || !comm.impl()->executor->carriesAddresses()) return 0;
  const auto& choice = comm.impl()->copyChoice;
  return choice ? choice->addressFrom() : comm.impl()->executor->addressFrom();
}

bool copyPathAdapts(const Communicator& comm) {
  return comm.impl() && comm.impl()->copyChoice.has_value();
}

std::vector<std::string> peerCopyPaths(const Communicator& comm) {
  if (!comm.impl()) return {};
  std::vector<std::string> paths;
  for (int peer = 0; peer < comm.size(); ++peer)
    paths.push_back(peer == comm.rank() ? "" : comm.impl()->wiring.connections[peer]->copyPaths());
  return paths;
}

}  // namespace detail

}  // namespace braid
