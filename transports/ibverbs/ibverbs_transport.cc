#include "transports/ibverbs/ibverbs_transport.h"

#include <algorithm>
#include <unordered_map>

#include "bootstrap/agree.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/ibverbs/fake_fabric_loader.h"
#include "transports/ibverbs/ib_select.h"
#include "transports/ibverbs/ib_wire.h"
#include "transports/ibverbs/ibverbs_connection.h"
#include "transports/ibverbs/ibverbs_device.h"
#include "transports/ibverbs/verbs_real.h"
#include "transports/tcp/tcp_transport.h"
#include "tuning/cost_model.h"

namespace braid::transport::ibverbs {
namespace {

// The control connections carry one set-up message each way, then only
// the tcp transport's own words.
constexpr size_t kControlSlotBytes = 4096;
constexpr int kControlSlots = 2;
// How long one wait on the completion queue lasts before the control
// connections are looked at.
constexpr std::chrono::milliseconds kWaitSlice{1};

class IbTransport final : public Transport {
 public:
  IbTransport(std::unique_ptr<VerbsBackend> backend, std::unique_ptr<Transport> control, int nranks)
      : backend_(std::move(backend)),
        control_(std::move(control)),
        byRank_(static_cast<size_t>(nranks), nullptr) {}

  // Bye on the control connections first, so that a peer whose WRs then
  // fail against this rank's destroyed QPs knows it was no failure; then
  // the QPs before the memory they use, the CQ, the PD, the device.
  ~IbTransport() override {
    control_.reset();
    for (auto& connection : connections_) connection->destroyQps();
    connections_.clear();
    if (cq_) backend_->destroyCq(cq_);
    if (pd_) backend_->deallocPd(pd_);
    if (device_) backend_->closeDevice(device_);
  }

  // Phase one, this rank alone: the device, the PD, a CQ for every QP's
  // completions, and each peer's end in INIT.
  void open(const Options& options, const std::vector<int>& peers, size_t slotBytes, int slots,
            int rank) {
    port_ = openFirstPort(*backend_, options, &path_);
    device_ = port_.device;
    pd_ = backend_->allocPd(device_);
    const int qps = options.qpsPerConnection;
    // Every completion the QPs can have outstanding: their send queues and
    // their receives.
    int64_t depth = 0;
    for (int q = 0; q < qps; ++q)
      depth += IbConnection::sendDepthFor(static_cast<size_t>(slots), qps) +
               IbConnection::receivesFor(static_cast<size_t>(slots), q);
    depth *= static_cast<int64_t>(peers.size());
    if (depth > port_.deviceInfo.maxCqe && port_.deviceInfo.maxCqe > 0)
      fail(ErrorCode::SystemError, rank,
           format("%s allows completion queues of %d entries, and %zu peers with %d QPs of %d "
                  "slots need %lld: lower BRAID_SLOTS or BRAID_IB_QPS_PER_CONNECTION",
                  port_.deviceName.c_str(), port_.deviceInfo.maxCqe, peers.size(), qps, slots,
                  static_cast<long long>(depth)));
    cq_ = backend_->createCq(device_, static_cast<int>(std::max<int64_t>(1, depth)));
    for (int peer : peers) {
      connections_.push_back(std::make_unique<IbConnection>(
          shared_, *backend_, pd_, cq_, control_->connection(peer), rank, peer, slotBytes,
          static_cast<size_t>(slots), qps, path_));
      IbConnection* connection = connections_.back().get();
      byRank_[static_cast<size_t>(peer)] = connection;
      for (size_t i = 0; i < connection->qps().size(); ++i)
        byQpNum_[connection->qps()[i].num] = {connection, static_cast<int>(i)};
    }
  }

  const char* name() const override { return "ibverbs"; }
  Connection& connection(int peer) override { return *byRank_[static_cast<size_t>(peer)]; }

  // The control connections, then every completion and async event, then
  // the receives and credit each connection owes.
  bool progress() override {
    throwIfFailed();
    bool moved = control_->progress();
    Completion completions[kPollBatch];
    for (;;) {
      const int got = backend_->pollCq(cq_, completions, kPollBatch);
      for (int i = 0; i < got; ++i) route(completions[i]);
      moved |= got > 0;
      if (got < kPollBatch) break;
    }
    AsyncEvent event;
    while (backend_->nextAsyncEvent(device_, &event)) take(event);
    for (auto& connection : connections_) moved |= connection->repost();
    throwIfFailed();
    return moved;
  }

  int failedPeer() const override {
    return failedPeer_ >= 0 ? failedPeer_ : control_->failedPeer();
  }

  // Credit every release not yet told, first: a sender may wait on it.
  void prepareToWait() override {
    for (auto& connection : connections_) connection->creditAll();
    control_->prepareToWait();
    snapshot_ = shared_.activity;
  }

  // Sleeps on the completion queue a slice at a time and returns, so the
  // executor looks at the control connections (a peer that died) in
  // between.
  void waitForActivity(Clock::time_point until) override {
    if (shared_.activity != snapshot_ || shared_.anyFailure) return;
    backend_->waitCq(cq_, std::min(until, Clock::now() + kWaitSlice));
  }

  void announceFailure(int failedRank, GiveUpReason reason) override {
    control_->announceFailure(failedRank, reason);
  }
  void announceWaitingFor(int rank) override { control_->announceWaitingFor(rank); }

  // Phase two, with every peer: the control connections, then each end
  // sent to its peer and the peer's end connected to.
  void connect(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
               net::Deadline deadline);

  std::string describe() const {
    return format("%s, device %s port %d (%s, MTU %d, GID index %d), %d QP%s per peer",
                  backend_->describe().c_str(), port_.deviceName.c_str(), port_.port,
                  port_.linkLayer == LinkLayer::Ethernet ? "RoCE" : "InfiniBand", path_.mtu,
                  port_.gidIndex, static_cast<int>(qpsPerPeer()), qpsPerPeer() == 1 ? "" : "s");
  }

 private:
  static constexpr int kPollBatch = 32;

  size_t qpsPerPeer() const { return connections_.empty() ? 0 : connections_[0]->qps().size(); }

  void route(const Completion& completion) {
    const auto found = byQpNum_.find(completion.qpNum);
    if (found == byQpNum_.end()) return;  // a QP already destroyed
    found->second.first->complete(found->second.second, completion);
  }

  void take(const AsyncEvent& event) {
    ++shared_.activity;
    switch (event.kind) {
      case AsyncEventKind::QpFatal:
      case AsyncEventKind::QpAccessError: {
        const auto found = byQpNum_.find(event.qpNum);
        if (found != byQpNum_.end())
          found->second.first->qpFailed(found->second.second,
                                        event.kind == AsyncEventKind::QpFatal
                                            ? "the QP went to the error state"
                                            : "the QP saw an access violation");
        return;
      }
      case AsyncEventKind::PortError:
        if (event.port != port_.port) return;  // a port this transport does not use
        failure_ = format("port %d of %s went down", event.port, port_.deviceName.c_str());
        shared_.anyFailure = true;
        return;
      case AsyncEventKind::DeviceFatal:
      case AsyncEventKind::CqError:
        failure_ = format("%s failed (async event %d)", port_.deviceName.c_str(), event.code);
        shared_.anyFailure = true;
        return;
      default:
        return;
    }
  }

  void throwIfFailed() {
    if (shared_.anyFailure) throwFirstFailure(failure_, connections_, &failedPeer_);
  }

  std::unique_ptr<VerbsBackend> backend_;
  std::unique_ptr<Transport> control_;
  UsablePort port_;
  PathOptions path_;
  Device* device_ = nullptr;
  ProtectionDomain* pd_ = nullptr;
  CompletionQueue* cq_ = nullptr;
  Shared shared_;
  std::vector<std::unique_ptr<IbConnection>> connections_;
  std::vector<IbConnection*> byRank_;
  std::unordered_map<uint32_t, std::pair<IbConnection*, int>> byQpNum_;
  uint64_t snapshot_ = 0;
  int failedPeer_ = -1;
  std::string failure_;  // of the device itself
};

void IbTransport::connect(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
                          net::Deadline deadline) {
  const int rank = bootstrap.rank();
  const bool useGid = port_.linkLayer == LinkLayer::Ethernet;
  // Every end goes out first, so no peer waits for one that failed later.
  for (int peer : peers) {
    const std::vector<std::byte> blob =
        encode(byRank_[static_cast<size_t>(peer)]->local(port_.lid, port_.gid, useGid, port_.mtu));
    Connection& control = control_->connection(peer);
    std::byte* slot = nullptr;
    while (!(slot = control.sendSlot(blob.size()))) {
      control_->progress();
      if (Clock::now() >= deadline)
        fail(ErrorCode::Timeout, rank, format("sending the verbs end to peer %d timed out", peer));
    }
    std::copy(blob.begin(), blob.end(), slot);
    control.postSend(static_cast<uint32_t>(blob.size()), 0);
  }
  std::vector<bool> connected(peers.size(), false);
  for (size_t left = peers.size(); left > 0;) {
    control_->progress();
    for (size_t i = 0; i < peers.size(); ++i) {
      if (connected[i]) continue;
      Connection& control = control_->connection(peers[i]);
      const Message* message = control.peekRecv();
      if (!message) {
        if (control.peerClosed())
          fail(ErrorCode::RemoteError, rank,
               format("peer %d closed its connection before sending its verbs end", peers[i]));
        continue;
      }
      const EndpointInfo remote = decode(message->data, message->bytes);
      control.releaseRecv();
      byRank_[static_cast<size_t>(peers[i])]->connect(remote, path_);
      connected[i] = true;
      --left;
    }
    if (left == 0) break;
    if (Clock::now() >= deadline) {
      for (size_t i = 0; i < peers.size(); ++i)
        if (!connected[i])
          fail(ErrorCode::Timeout, rank,
               format("waiting for peer %d's verbs end timed out", peers[i]));
    }
    control_->prepareToWait();
    if (!control_->progress())
      control_->waitForActivity(std::min(deadline, Clock::now() + std::chrono::milliseconds(10)));
  }
  // The control connections must have delivered this rank's ends.
  for (int peer : peers)
    while (!control_->connection(peer).flushed()) {
      control_->progress();
      if (Clock::now() >= deadline)
        fail(ErrorCode::Timeout, rank, format("sending the verbs end to peer %d timed out", peer));
    }
}

}  // namespace

SelectOptions selectOptions(const Options& options) {
  SelectOptions select;
  select.hca = options.hca;
  select.gidIndex = options.gidIndex;
  select.sysfsRoot = options.sysfs;
  return select;
}

std::unique_ptr<VerbsBackend> openBackend(const Options& options, std::string* why) {
  if (!options.fake.empty()) return loadFakeFabric(options.fake, options.fakeFault, why);
  return loadLibibverbs(why);
}

UsablePort openFirstPort(VerbsBackend& backend, const Options& options, PathOptions* path) {
  PortSelection selection = selectPorts(backend, selectOptions(options));
  if (selection.ports.empty()) throw Error(ErrorCode::SystemError, selection.reason);
  const UsablePort port = selection.ports.front();
  for (Device* device : selection.devices)
    if (device != port.device) backend.closeDevice(device);
  path->port = port.port;
  path->gidIndex = port.gidIndex;
  path->mtu = port.mtu;
  path->timeout = options.timeout;
  path->retryCount = options.retryCount;
  return port;
}

void validate(const Options& options) {
  parseHcaList(options.hca);
  checkGidIndex(options.gidIndex);
  checkTimeout(options.timeout);
  checkRetryCount(options.retryCount);
  checkQpsPerConnection(options.qpsPerConnection);
}

std::string probe(const Options& options) {
  try {
    std::string why;
    std::unique_ptr<VerbsBackend> backend = openBackend(options, &why);
    if (!backend) return why;
    PortSelection selection = selectPorts(*backend, selectOptions(options));
    selection.close(*backend);
    return selection.ports.empty() ? selection.reason : "";
  } catch (const Error& error) {
    return error.what();
  }
}

Options optionsFromKnobs() {
  Options options;
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
  validate(options);
  return options;
}

namespace {

std::unique_ptr<Transport> create(const Setup& setup, const std::vector<int>& peers,
                                  std::string* whyNot) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const net::Deadline deadline = setup.deadline;
  const Options options = optionsFromKnobs();
  std::unique_ptr<Transport> control =
      tcp::connectPeers(bootstrap, peers, kControlSlotBytes, kControlSlots, 1, deadline);
  std::unique_ptr<IbTransport> transport;
  try {
    bootstrap::agree(bootstrap, deadline, "ibverbs", "open its RDMA device", [&] {
      std::string why;
      std::unique_ptr<VerbsBackend> backend = openBackend(options, &why);
      if (!backend) throw Error(ErrorCode::SystemError, why);
      transport =
          std::make_unique<IbTransport>(std::move(backend), std::move(control), bootstrap.size());
      transport->open(options, peers, setup.slotBytes, setup.slots, bootstrap.rank());
    });
    bootstrap::agree(bootstrap, deadline, "ibverbs", "connect its QPs",
                     [&] { transport->connect(bootstrap, peers, deadline); });
  } catch (const Error& error) {
    // A bad knob, or knobs ranks set differently, is the user's to fix.
    if (error.code() == ErrorCode::Timeout || error.code() == ErrorCode::InvalidArgument) throw;
    *whyNot = error.what();
    return nullptr;
  }
  BRAID_INFO(Init, "ibverbs: %s", transport->describe().c_str());
  return transport;
}

// Every rank must have an active port; the first rank without one passes
// the transport over (AUTO) or fails the communicator (ON).
bool everyRankCan(const Setup& setup, TransportUse use) {
  const int rank = setup.bootstrap.rank();
  const std::string why = probe(optionsFromKnobs());
  const int without = firstRankWithout(setup, why.empty());
  if (without < 0) return true;
  if (without == rank) BRAID_INFO(Init, "ibverbs is not used: %s", why.c_str());
  if (use == TransportUse::On)
    fail(ErrorCode::SystemError, rank,
         without == rank
             ? format("BRAID_IBVERBS is ON, and %s", why.c_str())
             : format("BRAID_IBVERBS is ON, and rank %d has no usable RDMA port", without));
  return false;
}

}  // namespace

TransportEntry entry() {
  TransportEntry entry("ibverbs", Reach::AnyHost,
                       "RDMA writes over InfiniBand or RoCE queue pairs, any host; device buffers "
                       "by GPUDirect RDMA or staged");
  entry.create = create;
  entry.createDevice = [](const Setup& setup, const std::vector<int>& peers,
                          std::string*) -> std::unique_ptr<DeviceTransport> {
    return createDevice(setup, peers, optionsFromKnobs());
  };
  entry.useKnob = "BRAID_IBVERBS";
  entry.use = &Knobs::ibverbs;
  entry.everyRankCan = everyRankCan;
  entry.unusableHere = [] { return probe(optionsFromKnobs()); };
  // Not measured on RDMA hardware yet: tcp's numbers, and device buffers
  // modelled as staged (GPUDirect too).
  entry.hostLink = tuning::hostLinkModel(15e-6, 3e9);
  entry.deviceLink = tuning::deviceLinkModel(25e-6, 3e9);
  return entry;
}

}  // namespace braid::transport::ibverbs
