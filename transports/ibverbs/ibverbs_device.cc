#include "transports/ibverbs/ibverbs_device.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_map>

#include "bootstrap/agree.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/device_proxy.h"
#include "transports/ibverbs/ib_wire.h"

namespace braid::transport::ibverbs {
namespace {

// (kTransportBase + 0 is tcp's host sockets, + 1 tcp's device sockets.)
constexpr uint32_t kPurpose = static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 2;

// A link's StagingBlock: the transport's own words are the one the
// peer's NIC writes its releases into, and where flush READs land.
constexpr size_t kCreditIn = StagingBlock::kOwnWords;
constexpr size_t kFlushSink = StagingBlock::kOwnWords + 64;
constexpr int kMaxSlots = StagingBlock::kMaxSlots;

// wr_ids: what the WR is, and the link it belongs to.
enum WrKind : uint64_t { kDataWr = 1, kCreditWr = 2, kFlushWr = 3, kRecvWr = 4 };
uint64_t wrId(WrKind kind, size_t link) { return static_cast<uint64_t>(kind) << 56 | link; }
WrKind kindOf(uint64_t id) { return static_cast<WrKind>(id >> 56); }
size_t linkOf(uint64_t id) { return static_cast<size_t>(id & ((uint64_t{1} << 56) - 1)); }

// The side channel's words, each one frame.
struct Frame {
  enum Kind : uint32_t { Goodbye = 1, Failure = 2, WaitingFor = 3 };
  uint32_t kind = 0;
  int32_t value = 0;    // Failure: the rank blamed; WaitingFor: the rank
  uint32_t reason = 0;  // Failure: why the sender gave up (a GiveUpReason)
  uint32_t reserved = 0;
  uint64_t sent = 0;  // Goodbye: the messages this rank sent the peer
};

// After the connection record, where the peer writes this rank's credit.
struct CreditTarget {
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint32_t reserved = 0;
};

uint32_t load(const uint32_t* flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }
uint32_t low(uint64_t counter) { return static_cast<uint32_t>(counter); }

// How long a receiver waits for the messages a peer that said goodbye
// counted, and for the goodbye of a peer whose link broke.
constexpr auto kArrivalWait = std::chrono::seconds(1);
constexpr auto kBrokeGrace = std::chrono::milliseconds(100);

constexpr const char* kOpening = "open its RDMA device for device buffers";
constexpr const char* kConnecting = "connect the QPs of its device buffers";

class IbDeviceTransport final : public ProxiedDeviceTransport {
 public:
  IbDeviceTransport(device::Device& device, int deviceIndex, int rank, int nranks, size_t slotBytes,
                    int slots, const Options& options)
      : ProxiedDeviceTransport(device, deviceIndex, rank, nranks, slotBytes, slots, "ibverbs"),
        options_(options) {}

  // The proxy first; then the QPs before the memory they use, the CQ, the
  // PD, the device.
  ~IbDeviceTransport() override {
    stopProxy();
    if (!backend_) return;
    for (auto& link : links_)
      if (link->qp) backend_->destroyQp(link->qp);
    if (flushQp_) backend_->destroyQp(flushQp_);
    for (auto& link : links_) {
      if (link->slotsRegion) backend_->deregister(link->slotsRegion);
      if (link->blockRegion) backend_->deregister(link->blockRegion);
      if (kept_) continue;
      try {
        if (link->deviceSlots) device_.free(link->deviceSlots);
        if (link->block) device_.free(link->block);
      } catch (const Error& error) {
        BRAID_WARN(Exec, "ibverbs: freeing device FIFO memory failed: %s", error.what());
      }
    }
    if (cq_) backend_->destroyCq(cq_);
    if (pd_) backend_->deallocPd(pd_);
    if (verbsDevice_) backend_->closeDevice(verbsDevice_);
  }

  size_t deviceBytes() const override {
    size_t bytes = 0;  // the FIFO slots RDMA writes into (GPUDirect); blocks are host memory
    for (const auto& link : links_)
      if (link->deviceSlots) bytes += slotsBytes();
    return bytes;
  }

  void setUp(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
             net::Deadline deadline) {
    for (int peer : peers) {
      links_.push_back(std::make_unique<Link>());
      links_.back()->index = links_.size() - 1;
      links_.back()->peer = peer;
      addLink(links_.back().get());
    }
    // The device, memory and QPs, and the sockets upwards (a connect
    // never waits for the accept); then the sockets from below and the
    // exchange.
    bootstrap::agree(bootstrap, deadline, "ibverbs", kOpening, [&] {
      if (slots_ > static_cast<uint64_t>(kMaxSlots))
        throw Error(ErrorCode::InvalidArgument,
                    format("BRAID_DEVICE_SLOTS is %d; ibverbs carries at most %d",
                           static_cast<int>(slots_), kMaxSlots));
      if (!links_.empty()) open();
      for (auto& link : links_)
        if (link->peer > rank_) link->socket = bootstrap.connectTo(link->peer, kPurpose, deadline);
    });
    bootstrap::agree(bootstrap, deadline, "ibverbs", kConnecting, [&] {
      for (auto& link : links_)
        if (link->peer < rank_) link->socket = bootstrap.acceptFrom(link->peer, kPurpose, deadline);
      exchange(deadline);
    });
    if (links_.empty()) return;
    BRAID_INFO(Init, "ibverbs: device buffers %s (%s port %d)", describePath().c_str(),
               port_.deviceName.c_str(), port_.port);
    startProxy();
  }

  // ---- DeviceTransport.

  std::string path(int peer) const override {
    if (!linkTo(peer)) return "none";
    return gdr_ ? "ibverbs: GPUDirect RDMA (dma-buf)" : "ibverbs: staged through host memory";
  }

  std::string whyBroken(int peer) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    const ProxyLink* link = linkTo(peer);
    return link ? static_cast<const Link*>(link)->brokeWhy : "";
  }

 private:
  struct Link : ProxyLink {
    size_t index = 0;                  // in links_
    std::byte* block = nullptr;        // host: counters, NIC words, tags (and staged slots)
    std::byte* deviceSlots = nullptr;  // GPUDirect: send slots, then receive slots
    std::byte* sendSlots = nullptr;
    std::byte* recvSlots = nullptr;
    MemoryRegion* blockRegion = nullptr;
    MemoryRegion* slotsRegion = nullptr;  // GPUDirect; staged, the slots are in the block's
    Keys blockKeys, slotsKeys;
    QueuePair* qp = nullptr;
    uint32_t qpNum = 0;
    uint32_t psn = 0;
    uint64_t remoteSlots = 0;  // the peer's receive slots
    uint32_t remoteSlotsRkey = 0;
    uint64_t remoteCredit = 0;  // the peer's credit word
    uint32_t remoteCreditRkey = 0;

    // The proxy's (mutex_ held).
    uint64_t forwarded = 0;    // messages posted to the NIC
    uint32_t creditSent = 0;   // the last credit written to the peer
    uint32_t creditSeen = 0;   // the last credit of the peer copied for the stream
    int outstanding = 0;       // send WRs posted and not completed
    uint64_t arrived = 0;      // messages whose immediate arrived
    uint64_t published = 0;    // messages whose tag and `filled` the streams see
    uint64_t flushTarget = 0;  // the messages the flush READ in flight covers
    bool flushing = false;     // a flush READ is in flight
    uint32_t arrivedTags[kMaxSlots] = {};
    std::string outbox;           // side-channel bytes not yet sent
    std::string inbox;            // side-channel bytes of a frame not yet whole
    bool lastWordQueued = false;  // a goodbye or failure is in the outbox: shut after it
    bool closing = false;         // the peer left, or the link broke: report it soon
    Clock::time_point closingSince;
    bool goodbye = false;      // the peer said goodbye first...
    uint64_t goodbyeSent = 0;  // ...after sending this many messages
    bool broken = false;       // a WR failed: nothing more is posted
    std::string brokeWhy;      // ...before the peer left: why (whyBroken())
    Clock::time_point brokeSince;
  };

  size_t blockBytes() const {
    return StagingBlock::kSlots + (gdr_ ? 0 : 2 * slotBytes_ * static_cast<size_t>(slots_));
  }
  size_t slotsBytes() const { return 2 * slotBytes_ * static_cast<size_t>(slots_); }
  int sendDepth() const { return 2 * static_cast<int>(slots_) + 4; }
  int receives() const { return static_cast<int>(slots_) + 2; }

  std::string describePath() const {
    return gdr_ ? "go over GPUDirect RDMA: the NIC reads and writes device memory (dma-buf)"
                : format("are staged through page-locked host memory (%s)", whyStaged_.c_str());
  }

  // ---- Set-up (the calling thread).

  void open() {
    std::string why;
    backend_ = openBackend(options_, &why);
    if (!backend_) throw Error(ErrorCode::SystemError, why);
    port_ = openFirstPort(*backend_, options_, &path_);
    verbsDevice_ = port_.device;
    pd_ = backend_->allocPd(verbsDevice_);
    chooseSlots();
    const int64_t depth = static_cast<int64_t>(links_.size()) * (sendDepth() + receives()) +
                          static_cast<int64_t>(links_.size()) + 2;
    if (depth > port_.deviceInfo.maxCqe && port_.deviceInfo.maxCqe > 0)
      throw Error(ErrorCode::SystemError,
                  format("%s allows completion queues of %d entries, and %zu peers' device FIFOs "
                         "need %lld: lower BRAID_DEVICE_SLOTS",
                         port_.deviceName.c_str(), port_.deviceInfo.maxCqe, links_.size(),
                         static_cast<long long>(depth)));
    cq_ = backend_->createCq(verbsDevice_, static_cast<int>(depth));
    for (size_t i = 0; i < links_.size(); ++i) openLink(*links_[i]);
    if (gdr_) openFlushQp();
  }

  // GPUDirect RDMA or staging, tried once on the first link's slots:
  // every link then takes the same way.
  void chooseSlots() {
    if (options_.gdr == TransportUse::Off) {
      whyStaged_ = "BRAID_IB_GDR is OFF";
      return;
    }
    Link& first = *links_.front();
    first.deviceSlots = static_cast<std::byte*>(device_.allocate(deviceIndex_, slotsBytes()));
    whyStaged_ = registerDeviceSlots(first);
    gdr_ = whyStaged_.empty();
    if (gdr_) return;
    device_.free(first.deviceSlots);
    first.deviceSlots = nullptr;
    if (options_.gdr == TransportUse::On)
      throw Error(ErrorCode::SystemError, format("BRAID_IB_GDR is ON, and %s", whyStaged_.c_str()));
  }

  // Registers the link's device slots through their dma-buf; "" when it
  // worked, else why not.
  std::string registerDeviceSlots(Link& link) {
    uint64_t offset = 0;
    std::string why;
    const int fd = device_.exportDmabuf(link.deviceSlots, slotsBytes(), &offset, &why);
    if (fd < 0) return format("the %s device gives no dma-buf: %s", device_.name(), why.c_str());
    link.slotsRegion = backend_->registerDmabuf(
        pd_, fd, offset, slotsBytes(), reinterpret_cast<uint64_t>(link.deviceSlots),
        kLocalWrite | kRemoteWrite | kRemoteRead, &link.slotsKeys);
    ::close(fd);
    if (!link.slotsRegion)
      return format("%s cannot register dma-bufs (%s)", port_.deviceName.c_str(),
                    backend_->describe().c_str());
    return "";
  }

  void openLink(Link& link) {
    link.block = static_cast<std::byte*>(device_.allocateHost(blockBytes()));
    const int fd = device_.exportFd(link.block);
    link.blockRegion =
        backend_->registerMappedFile(pd_, link.block, blockBytes(), fd, 0,
                                     kLocalWrite | kRemoteWrite | kRemoteRead, &link.blockKeys);
    ::close(fd);
    if (!link.blockRegion)
      throw Error(ErrorCode::SystemError,
                  format("%s cannot register the page-locked host memory of rank %d's device "
                         "FIFO (%zu bytes)",
                         port_.deviceName.c_str(), link.peer, blockBytes()));
    if (gdr_ && !link.deviceSlots) {
      link.deviceSlots = static_cast<std::byte*>(device_.allocate(deviceIndex_, slotsBytes()));
      if (std::string why = registerDeviceSlots(link); !why.empty())
        throw Error(ErrorCode::SystemError, why);
    }
    std::byte* slots = gdr_ ? link.deviceSlots : link.block + StagingBlock::kSlots;
    link.sendSlots = slots;
    link.recvSlots = slots + slotBytes_ * static_cast<size_t>(slots_);
    StagingBlock::wire(link.connection, link.peer, link.block, link.sendSlots, link.recvSlots);

    QpCaps caps;
    caps.sendDepth = sendDepth();
    caps.recvDepth = receives();
    caps.maxInline = sizeof(uint32_t);  // credit goes inline
    link.qp = backend_->createQp(pd_, cq_, cq_, caps, &link.qpNum);
    link.psn = (link.qpNum * 2654435761u + static_cast<uint32_t>(rank_)) & 0xffffff;
    backend_->toInit(link.qp, path_);
  }

  // The QP flush READs go on, connected to itself.
  void openFlushQp() {
    QpCaps caps;
    caps.sendDepth = static_cast<int>(links_.size()) + 2;
    caps.recvDepth = 1;
    uint32_t num = 0;
    flushQp_ = backend_->createQp(pd_, cq_, cq_, caps, &num);
    flushQpNum_ = num;
    backend_->toInit(flushQp_, path_);
    RemoteQp self;
    self.qpNum = num;
    self.psn = num & 0xffffff;
    self.lid = port_.lid;
    self.gid = port_.gid;
    self.useGid = port_.linkLayer == LinkLayer::Ethernet;
    backend_->toRtr(flushQp_, self, path_);
    PathOptions mine = path_;
    mine.psn = self.psn;
    backend_->toRts(flushQp_, mine);
  }

  // Every end goes out first, so no peer waits for one that failed later;
  // then each peer's end is connected to.
  void exchange(net::Deadline deadline) {
    const bool useGid = port_.linkLayer == LinkLayer::Ethernet;
    for (auto& link : links_) {
      EndpointInfo info;
      info.lid = port_.lid;
      info.gid = port_.gid;
      info.useGid = useGid;
      info.mtu = static_cast<uint32_t>(port_.mtu);
      info.qpNums = {link->qpNum};
      info.psns = {link->psn};
      info.fifoAddress = reinterpret_cast<uint64_t>(link->recvSlots);
      info.fifoRkey = gdr_ ? link->slotsKeys.rkey : link->blockKeys.rkey;
      info.slots = static_cast<uint32_t>(slots_);
      info.slotBytes = static_cast<uint32_t>(slotBytes_);
      std::vector<std::byte> blob = encode(info);
      CreditTarget credit;
      credit.address = reinterpret_cast<uint64_t>(link->block + kCreditIn);
      credit.rkey = link->blockKeys.rkey;
      const auto* raw = reinterpret_cast<const std::byte*>(&credit);
      blob.insert(blob.end(), raw, raw + sizeof(credit));
      link->socket.sendAll(blob.data(), blob.size(), deadline, format("rank %d", link->peer));
    }
    for (auto& link : links_) {
      std::vector<std::byte> blob(encodedSize(1) + sizeof(CreditTarget));
      link->socket.recvAll(blob.data(), blob.size(), deadline, format("rank %d", link->peer));
      const EndpointInfo remote = decode(blob.data(), encodedSize(1));
      CreditTarget credit;
      std::memcpy(&credit, blob.data() + encodedSize(1), sizeof(credit));
      if (remote.slots != slots_ || remote.slotBytes != slotBytes_)
        throw Error(ErrorCode::InvalidArgument,
                    format("rank %d's device FIFOs have %u slots of %u bytes, this rank's %d of "
                           "%zu: BRAID_DEVICE_SLOT_BYTES and BRAID_DEVICE_SLOTS must be the same "
                           "on every rank",
                           link->peer, remote.slots, remote.slotBytes, static_cast<int>(slots_),
                           slotBytes_));
      link->remoteSlots = remote.fifoAddress;
      link->remoteSlotsRkey = remote.fifoRkey;
      link->remoteCredit = credit.address;
      link->remoteCreditRkey = credit.rkey;
      RemoteQp to;
      to.qpNum = remote.qpNums[0];
      to.psn = remote.psns[0];
      to.lid = remote.lid;
      to.gid = remote.gid;
      to.useGid = remote.useGid;
      PathOptions mine = path_;
      mine.mtu = std::min(path_.mtu, static_cast<int>(remote.mtu));
      backend_->toRtr(link->qp, to, mine);
      mine.psn = link->psn;
      backend_->toRts(link->qp, mine);
      for (int i = 0; i < receives(); ++i) postReceive(*link);
      if (link->broken)
        throw Error(
            ErrorCode::SystemError,
            format("posting the receives for rank %d's device messages failed", link->peer));
      link->socket.setNonBlocking(true);
      link->socket.setNoDelay();
    }
    for (size_t i = 0; i < links_.size(); ++i) byQpNum_[links_[i]->qpNum] = i;
  }

  // ---- The proxy thread (mutex_ held).

  void queueFailure(ProxyLink& link, int failedRank, GiveUpReason reason) override {
    Frame frame;
    frame.kind = Frame::Failure;
    frame.value = failedRank;
    frame.reason = static_cast<uint32_t>(reason);
    queue(static_cast<Link&>(link), frame);
  }

  void queueWaitingFor(ProxyLink& link, int rank) override {
    Frame frame;
    frame.kind = Frame::WaitingFor;
    frame.value = rank;
    queue(static_cast<Link&>(link), frame);
  }

  // A link's socket said all it will once the link is closing.
  bool listening(const ProxyLink& link) const override {
    return !static_cast<const Link&>(link).closing;
  }

  // Whether the proxy must look again soon: messages or credit the
  // streams will write, messages they wait for, WRs in flight.
  bool owed() const override {
    for (const auto& link : links_) {
      if (link->closed) continue;
      if (link->closing || link->broken || !link->outbox.empty()) return true;
      if (quiet_) continue;
      if (link->outstanding > 0 || link->flushing) return true;
      if (link->forwarded < link->sendsDue.load(std::memory_order_seq_cst) ||
          link->creditSent != low(link->receivesDue.load(std::memory_order_seq_cst)) ||
          link->published < link->receivesDue.load(std::memory_order_seq_cst) ||
          link->creditSeen != low(link->forwarded))
        return true;
    }
    return false;
  }

  bool turn() override {
    bool moved = pollCompletions();
    for (auto& link : links_) {
      if (!link->closing) moved |= receiveWords(*link);
      // (A peer that left or gave up takes nothing more.)
      if (!quiet_ && !link->broken && !link->closing) moved |= forward(*link);
      if (!link->shut) moved |= sendWords(*link);
      moved |= settle(*link);
    }
    return moved;
  }

  // ---- Verbs.

  bool pollCompletions() {
    Completion completions[32];
    bool moved = false;
    for (;;) {
      const int got = backend_->pollCq(cq_, completions, 32);
      for (int i = 0; i < got; ++i) complete(completions[i]);
      moved |= got > 0;
      if (got < 32) return moved;
    }
  }

  void complete(const Completion& completion) {
    const bool flush = flushQp_ && completion.qpNum == flushQpNum_;
    const size_t index = flush ? linkOf(completion.wrId) : qpLink(completion.qpNum);
    if (index >= links_.size()) return;  // (a QP not this transport's)
    Link& link = *links_[index];
    const WrKind kind = kindOf(completion.wrId);
    if (completion.status != WcStatus::Success) {
      const char* hint = wcStatusHint(completion.status);
      broke(link, format("%s %u: %s (vendor error 0x%x)%s%s", flush ? "the flush QP" : "QP",
                         completion.qpNum, wcStatusName(completion.status), completion.vendorError,
                         *hint ? ": " : "", hint));
      if (kind == kFlushWr) link.flushing = false;
      if (kind == kDataWr || kind == kCreditWr) --link.outstanding;
      return;
    }
    switch (kind) {
      case kRecvWr:
        link.arrivedTags[link.arrived % slots_] = completion.imm;
        ++link.arrived;
        postReceive(link);
        if (gdr_)
          requestFlush(link);
        else
          publish(link, link.arrived);
        return;
      case kFlushWr:
        link.flushing = false;
        publish(link, link.flushTarget);
        requestFlush(link);
        return;
      case kDataWr:
      case kCreditWr:
        --link.outstanding;
        return;
    }
  }

  size_t qpLink(uint32_t qpNum) const {
    const auto found = byQpNum_.find(qpNum);
    return found == byQpNum_.end() ? links_.size() : found->second;
  }

  void postReceive(Link& link) {
    RecvRequest request;
    request.wrId = wrId(kRecvWr, link.index);
    if (const int rc = backend_->postRecv(link.qp, &request, 1); rc != 0)
      broke(link, format("posting a receive failed (%s)", std::strerror(rc)));
  }

  // Posts a send WR, signaled; false (the link broken) when the device
  // refused it.
  bool post(Link& link, QueuePair* qp, const SendRequest& request) {
    if (const int rc = backend_->postSend(qp, &request, 1); rc != 0) {
      broke(link, format("posting a send failed (%s)", std::strerror(rc)));
      return false;
    }
    if (qp == link.qp) ++link.outstanding;
    return true;
  }

  // Reads a word of the link's receive slots through the flush QP, which
  // completes only once the NIC's earlier writes into device memory did.
  void requestFlush(Link& link) {
    if (link.flushing || link.arrived == link.published || link.broken) return;
    SendRequest read;
    read.wrId = wrId(kFlushWr, link.index);
    read.opcode = Opcode::Read;
    read.signaled = true;
    read.local = link.block + kFlushSink;
    read.lkey = link.blockKeys.lkey;
    read.bytes = sizeof(uint32_t);
    read.remoteAddr = reinterpret_cast<uint64_t>(link.recvSlots);
    read.rkey = link.slotsKeys.rkey;
    if (!post(link, flushQp_, read)) return;
    link.flushing = true;
    link.flushTarget = link.arrived;
  }

  // Messages up to `upTo` are in their slots: their tags, then `filled`.
  void publish(Link& link, uint64_t upTo) {
    if (upTo <= link.published) return;
    if (!quiet_) {
      for (uint64_t m = link.published; m < upTo; ++m)
        device_.writeFlagNow(link.connection.recv.tags + m % slots_, link.arrivedTags[m % slots_]);
      device_.writeFlagNow(link.connection.recv.filled, low(upTo));
    }
    link.published = upTo;
  }

  // Messages the stream wrote go to the peer; the peer's credit to the
  // stream; the stream's credit to the peer.
  bool forward(Link& link) {
    bool moved = false;
    DeviceConnection& c = link.connection;
    while (link.outstanding < sendDepth() &&
           static_cast<int32_t>(load(c.send.filled) - low(link.forwarded)) > 0) {
      const uint64_t slot = link.forwarded % slots_;
      SendRequest write;
      write.wrId = wrId(kDataWr, link.index);
      write.opcode = Opcode::WriteWithImm;
      write.signaled = true;
      write.local = link.sendSlots + slot * slotBytes_;
      write.lkey = gdr_ ? link.slotsKeys.lkey : link.blockKeys.lkey;
      write.bytes =
          std::min<uint32_t>(load(c.send.lengths + slot), static_cast<uint32_t>(slotBytes_));
      write.remoteAddr = link.remoteSlots + slot * slotBytes_;
      write.rkey = link.remoteSlotsRkey;
      write.imm = load(c.send.tags + slot);
      if (!post(link, link.qp, write)) return true;
      ++link.forwarded;
      moved = true;
    }
    if (const uint32_t credit = load(StagingBlock::word(link.block, kCreditIn));
        credit != link.creditSeen) {
      device_.writeFlagNow(c.send.credit, credit);
      link.creditSeen = credit;
      moved = true;
    }
    if (const uint32_t credit = load(c.recv.credit);
        credit != link.creditSent && link.outstanding < sendDepth()) {
      SendRequest write;
      write.wrId = wrId(kCreditWr, link.index);
      write.opcode = Opcode::Write;
      write.signaled = true;
      write.inlineData = true;
      write.local = const_cast<uint32_t*>(&credit);
      write.bytes = sizeof(credit);
      write.remoteAddr = link.remoteCredit;
      write.rkey = link.remoteCreditRkey;
      if (!post(link, link.qp, write)) return true;
      link.creditSent = credit;
      moved = true;
    }
    return moved;
  }

  // A WR of the link failed. After the peer left that is expected (its
  // QP is gone); else the link is lost, and the executor fails the
  // communicator. Which one is told once the socket had kBrokeGrace to
  // bring the peer's goodbye, which may trail the failure (settle()).
  void broke(Link& link, const std::string& why) {
    if (link.broken) return;
    link.broken = true;
    link.brokeSince = Clock::now();
    if (link.closing || link.goodbye || quiet_ || stopping_)
      BRAID_DEBUG(Exec, "ibverbs: device connection to rank %d: %s", link.peer, why.c_str());
    else
      link.brokeWhy = why;
  }

  // ---- The side channel.

  void queue(Link& link, const Frame& frame) {
    if (link.shut || link.lastWordQueued) return;
    const auto* raw = reinterpret_cast<const char*>(&frame);
    link.outbox.append(raw, sizeof(frame));
    if (frame.kind == Frame::Goodbye || frame.kind == Frame::Failure) link.lastWordQueued = true;
  }

  bool receiveWords(Link& link) {
    bool moved = false;
    char buffer[sizeof(Frame) * 16];
    for (;;) {
      const ssize_t got = ::recv(link.socket.fd(), buffer, sizeof(buffer), MSG_DONTWAIT);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return moved;
      if (got <= 0) {
        BRAID_DEBUG(Exec, "ibverbs: device side channel to rank %d: %s", link.peer,
                    got == 0 ? "closed" : std::strerror(errno));
        close(link);
        return true;
      }
      moved = true;
      link.inbox.append(buffer, static_cast<size_t>(got));
      size_t at = 0;
      for (; link.inbox.size() - at >= sizeof(Frame); at += sizeof(Frame)) {
        Frame frame;
        std::memcpy(&frame, link.inbox.data() + at, sizeof(frame));
        if (!take(link, frame)) {
          link.inbox.clear();
          return true;
        }
      }
      link.inbox.erase(0, at);
    }
  }

  // A whole frame arrived; false when it was the peer's last.
  bool take(Link& link, const Frame& frame) {
    switch (frame.kind) {
      case Frame::Goodbye:
        link.goodbye = true;
        link.goodbyeSent = frame.sent;
        return true;
      case Frame::WaitingFor:
        link.waitsFor = frame.value;
        heard_.push_back({link.peer, frame.value, false, false, false, -1});
        return true;
      case Frame::Failure:  // reported as a close: nothing the peer sends matters now
        link.closing = link.closed = true;
        heard_.push_back({link.peer, -1, true, false, true, frame.value,
                          static_cast<GiveUpReason>(frame.reason)});
        return false;
      default:
        BRAID_WARN(Exec, "braid rank %d: ibverbs: rank %d sent a device word braid does not know",
                   rank_, link.peer);
        close(link);
        return false;
    }
  }

  void close(Link& link) {
    if (link.closing) return;
    link.closing = true;
    link.closingSince = Clock::now();
  }

  // A peer that left is reported once every message it counted arrived
  // (a receive completion may trail its socket's goodbye), or a second on.
  // A link that broke is reported once its socket had kBrokeGrace to say
  // the peer left.
  bool settle(Link& link) {
    if (link.broken && !link.closing) {
      if (link.goodbye) link.brokeWhy.clear();
      if (!link.goodbye && Clock::now() - link.brokeSince < kBrokeGrace) return false;
      if (!link.brokeWhy.empty())
        BRAID_WARN(Exec, "braid rank %d: ibverbs: the device connection to rank %d failed: %s",
                   rank_, link.peer, link.brokeWhy.c_str());
      close(link);
    }
    if (!link.closing || link.closed) return false;
    if (link.goodbye && !link.broken && link.published < link.goodbyeSent &&
        Clock::now() - link.closingSince < kArrivalWait)
      return false;
    link.closed = true;
    heard_.push_back({link.peer, -1, true, link.goodbye, false, -1});
    return true;
  }

  bool sendWords(Link& link) {
    if (link.goodbyeDue && !link.lastWordQueued && !quiet_ &&
        (link.broken || link.closing ||
         (link.forwarded == link.sendsDue.load(std::memory_order_seq_cst) &&
          link.outstanding == 0 &&
          link.creditSent == low(link.receivesDue.load(std::memory_order_seq_cst))))) {
      Frame frame;
      frame.kind = Frame::Goodbye;
      frame.sent = link.forwarded;
      queue(link, frame);
    }
    bool moved = false;
    while (!link.outbox.empty()) {
      const ssize_t n = ::send(link.socket.fd(), link.outbox.data(), link.outbox.size(),
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        link.blocked = true;
        return moved;
      }
      link.blocked = false;
      if (n < 0) {  // the peer is gone: its socket says so to receiveWords() too
        link.shut = true;
        link.outbox.clear();
        return true;
      }
      moved = true;
      link.outbox.erase(0, static_cast<size_t>(n));
    }
    if (link.lastWordQueued) {
      ::shutdown(link.socket.fd(), SHUT_WR);
      link.shut = true;
      moved = true;
    }
    return moved;
  }

  const Options options_;
  std::unique_ptr<VerbsBackend> backend_;
  UsablePort port_;
  PathOptions path_;
  Device* verbsDevice_ = nullptr;
  ProtectionDomain* pd_ = nullptr;
  CompletionQueue* cq_ = nullptr;
  QueuePair* flushQp_ = nullptr;
  uint32_t flushQpNum_ = 0;
  bool gdr_ = false;
  std::string whyStaged_;
  std::vector<std::unique_ptr<Link>> links_;
  std::unordered_map<uint32_t, size_t> byQpNum_;
};

}  // namespace

std::unique_ptr<DeviceTransport> createDevice(const Setup& setup, const std::vector<int>& peers,
                                              const Options& options) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  auto transport =
      std::make_unique<IbDeviceTransport>(*setup.device, setup.deviceIndex, bootstrap.rank(),
                                          bootstrap.size(), setup.slotBytes, setup.slots, options);
  transport->setUp(bootstrap, peers, setup.deadline);
  return transport;
}

}  // namespace braid::transport::ibverbs
