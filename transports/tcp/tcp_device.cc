#include "transports/tcp/tcp_device.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "bootstrap/agree.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/device_proxy.h"

namespace braid::transport::tcp {
namespace {

// (kTransportBase + 0 is the host transport's sockets.)
constexpr uint32_t kPurpose = static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 1;

// Everything on the socket is a frame; a Data frame's payload follows it.
struct Frame {
  enum Kind : uint32_t { Data = 1, Credit = 2, Goodbye = 3, Failure = 4, WaitingFor = 5 };
  uint32_t kind = 0;
  uint32_t tag = 0;    // Data: the op's tag
  uint32_t bytes = 0;  // Data: the payload's length; Failure: why (a GiveUpReason)
  int32_t value = 0;   // Credit: the counter; Failure: the rank blamed; WaitingFor: the rank
};

// What two ends check of each other first.
struct Hello {
  uint64_t slotBytes;
  int32_t slots;
  int32_t rank;
};

uint32_t load(const uint32_t* flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }
uint32_t low(uint64_t counter) { return static_cast<uint32_t>(counter); }

constexpr const char* kSettingUp = "set up device staging";

class TcpDeviceTransport final : public ProxiedDeviceTransport {
 public:
  TcpDeviceTransport(device::Device& device, int deviceIndex, int rank, int nranks,
                     size_t slotBytes, int slots)
      : ProxiedDeviceTransport(device, deviceIndex, rank, nranks, slotBytes, slots, "tcp") {}

  ~TcpDeviceTransport() override {
    stopProxy();
    for (auto& link : links_) {
      if (!link->block || kept_) continue;
      try {
        device_.free(link->block);
      } catch (const Error& error) {
        BRAID_WARN(Exec, "tcp: freeing a device staging block failed: %s", error.what());
      }
    }
  }

  size_t blockBytes() const { return StagingBlock::kSlots + 2 * slotBytes_ * slots_; }

  void setUp(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
             net::Deadline deadline) {
    for (int peer : peers) {
      links_.push_back(std::make_unique<Link>());
      links_.back()->peer = peer;
      addLink(links_.back().get());
    }
    // Memory, then the sockets: upwards first (a connect never waits for
    // the accept), then from below.
    bootstrap::agree(bootstrap, deadline, "tcp", kSettingUp, [&] {
      for (auto& link : links_) {
        link->block = static_cast<std::byte*>(device_.allocateHost(blockBytes()));
        std::byte* slots = link->block + StagingBlock::kSlots;
        StagingBlock::wire(link->connection, link->peer, link->block, slots,
                           slots + slotBytes_ * slots_);
      }
      for (auto& link : links_)
        if (link->peer > rank_) link->socket = bootstrap.connectTo(link->peer, kPurpose, deadline);
    });
    bootstrap::agree(bootstrap, deadline, "tcp", kSettingUp, [&] {
      for (auto& link : links_)
        if (link->peer < rank_) link->socket = bootstrap.acceptFrom(link->peer, kPurpose, deadline);
      const Hello mine{slotBytes_, static_cast<int32_t>(slots_), rank_};
      for (auto& link : links_)
        link->socket.sendAll(&mine, sizeof(mine), deadline, format("rank %d", link->peer));
      for (auto& link : links_) {
        Hello theirs{};
        link->socket.recvAll(&theirs, sizeof(theirs), deadline, format("rank %d", link->peer));
        if (theirs.slotBytes != slotBytes_ || theirs.slots != static_cast<int32_t>(slots_))
          throw Error(
              ErrorCode::InvalidArgument,
              format("rank %d's device FIFOs have %d slots of %llu bytes, this rank's "
                     "%d of %zu: BRAID_DEVICE_SLOT_BYTES and BRAID_DEVICE_SLOTS must be "
                     "the same on every rank",
                     link->peer, theirs.slots, static_cast<unsigned long long>(theirs.slotBytes),
                     static_cast<int>(slots_), slotBytes_));
        link->socket.setNonBlocking(true);
        link->socket.setNoDelay();
      }
    });
    startProxy();
  }

  // ---- DeviceTransport.

  std::string path(int peer) const override {
    return linkTo(peer) ? "tcp: staged through host memory" : "none";
  }

 private:
  struct Link : ProxyLink {
    std::byte* block = nullptr;
    // The proxy's (mutex_ held).
    uint64_t forwarded = 0;   // messages whose frame went out whole
    uint64_t received = 0;    // messages that arrived whole
    uint32_t creditSent = 0;  // the last credit the peer was told
    Frame out;                // the frame going out...
    const std::byte* payload = nullptr;
    size_t outDone = 0;    // ...and how much of it (header and payload) left
    bool sending = false;  // `out` is one
    Frame in;              // the frame coming in, and how much of it arrived
    size_t inDone = 0;
    std::deque<Frame> outbox;  // side-channel words to send (before any more data)
    bool goodbye = false;      // it said goodbye first
  };

  // ---- The proxy thread (mutex_ held).

  void queueFailure(ProxyLink& link, int failedRank, GiveUpReason reason) override {
    Frame frame;
    frame.kind = Frame::Failure;
    frame.value = failedRank;
    frame.bytes = static_cast<uint32_t>(reason);
    static_cast<Link&>(link).outbox.push_back(frame);
  }

  void queueWaitingFor(ProxyLink& link, int rank) override {
    Frame frame;
    frame.kind = Frame::WaitingFor;
    frame.value = rank;
    static_cast<Link&>(link).outbox.push_back(frame);
  }

  // Whether this rank's streams will write words the proxy must forward.
  bool owed() const override {
    if (quiet_) return false;
    for (const auto& link : links_) {
      if (link->closed || link->shut) continue;
      if (link->forwarded < link->sendsDue.load(std::memory_order_seq_cst) ||
          link->creditSent != low(link->receivesDue.load(std::memory_order_seq_cst)))
        return true;
    }
    return false;
  }

  // Moves what can move on every socket without blocking; true if anything
  // did.
  bool turn() override {
    bool moved = false;
    for (auto& link : links_) {
      if (!link->closed) moved |= receive(*link);
      if (!link->shut) moved |= transmit(*link);
    }
    return moved;
  }

  bool receive(Link& link) {
    bool moved = false;
    for (;;) {
      // The header, then a Data frame's payload straight into its slot.
      const bool header = link.inDone < sizeof(Frame);
      std::byte* into = header
                            ? reinterpret_cast<std::byte*>(&link.in) + link.inDone
                            : link.connection.recv.slots + (link.received % slots_) * slotBytes_ +
                                  (link.inDone - sizeof(Frame));
      const size_t want =
          header ? sizeof(Frame) - link.inDone : sizeof(Frame) + link.in.bytes - link.inDone;
      const ssize_t got = ::recv(link.socket.fd(), into, want, MSG_DONTWAIT);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return moved;
      if (got <= 0) {
        lost(link, got == 0 ? "closed" : std::strerror(errno));
        return true;
      }
      moved = true;
      link.inDone += static_cast<size_t>(got);
      if (link.inDone < sizeof(Frame)) continue;
      const Frame& frame = link.in;
      const size_t payload = frame.kind == Frame::Data ? frame.bytes : 0;
      if (payload > slotBytes_) {
        lost(link, "sent a message larger than a slot");
        return true;
      }
      if (link.inDone < sizeof(Frame) + payload) continue;
      link.inDone = 0;
      if (!take(link, frame)) return true;
    }
  }

  // A whole frame arrived; false when it was the peer's last.
  bool take(Link& link, const Frame& frame) {
    DeviceConnection& c = link.connection;
    switch (frame.kind) {
      case Frame::Data:
        if (!quiet_) {
          device_.writeFlagNow(c.recv.tags + link.received % slots_, frame.tag);
          device_.writeFlagNow(c.recv.filled, low(link.received + 1));
        }
        ++link.received;
        return true;
      case Frame::Credit:
        if (!quiet_) device_.writeFlagNow(c.send.credit, static_cast<uint32_t>(frame.value));
        return true;
      case Frame::Goodbye:
        link.goodbye = true;
        return true;
      case Frame::WaitingFor:
        link.waitsFor = frame.value;
        heard_.push_back({link.peer, frame.value, false, false, false, -1});
        return true;
      case Frame::Failure:  // reported as a close: nothing the peer sends matters now
        link.closed = true;
        heard_.push_back({link.peer, -1, true, false, true, frame.value,
                          static_cast<GiveUpReason>(frame.bytes)});
        return false;
      default:
        lost(link, "sent a frame braid does not know");
        return false;
    }
  }

  void lost(Link& link, const char* why) {
    if (!link.goodbye) BRAID_DEBUG(Exec, "tcp: device connection to rank %d: %s", link.peer, why);
    link.closed = true;
    heard_.push_back({link.peer, -1, true, link.goodbye, false, -1});
  }

  // The next frame to send: side-channel words first, then credit, then
  // data, and a goodbye once everything the streams wrote went out.
  bool nextFrame(Link& link) {
    DeviceConnection& c = link.connection;
    link.payload = nullptr;
    link.outDone = 0;
    if (!link.outbox.empty()) {
      link.out = link.outbox.front();
      link.outbox.pop_front();
      return true;
    }
    if (quiet_) return false;
    if (const uint32_t credit = load(c.recv.credit); credit != link.creditSent) {
      link.out = Frame{Frame::Credit, 0, 0, static_cast<int32_t>(credit)};
      link.creditSent = credit;
      return true;
    }
    if (static_cast<int32_t>(load(c.send.filled) - low(link.forwarded)) > 0) {
      const uint64_t slot = link.forwarded % slots_;
      link.out = Frame{
          Frame::Data, load(c.send.tags + slot),
          std::min<uint32_t>(load(c.send.lengths + slot), static_cast<uint32_t>(slotBytes_)), 0};
      link.payload = c.send.slots + slot * slotBytes_;
      return true;
    }
    if (link.goodbyeDue && link.forwarded == link.sendsDue.load(std::memory_order_seq_cst) &&
        link.creditSent == low(link.receivesDue.load(std::memory_order_seq_cst))) {
      link.out = Frame{Frame::Goodbye, 0, 0, 0};
      return true;
    }
    return false;
  }

  bool transmit(Link& link) {
    bool moved = false;
    for (;;) {
      if (!link.sending) {
        if (!nextFrame(link)) return moved;
        link.sending = true;
      }
      const size_t payloadBytes = link.payload ? link.out.bytes : 0;
      iovec iov[2];
      int parts = 0;
      if (link.outDone < sizeof(Frame))
        iov[parts++] = {reinterpret_cast<std::byte*>(&link.out) + link.outDone,
                        sizeof(Frame) - link.outDone};
      if (payloadBytes) {
        const size_t from = link.outDone > sizeof(Frame) ? link.outDone - sizeof(Frame) : 0;
        iov[parts++] = {const_cast<std::byte*>(link.payload) + from, payloadBytes - from};
      }
      msghdr message{};
      message.msg_iov = iov;
      message.msg_iovlen = static_cast<size_t>(parts);
      const ssize_t n = ::sendmsg(link.socket.fd(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        link.blocked = true;
        return moved;
      }
      link.blocked = false;
      if (n < 0) {  // the peer is gone: its socket says so to receive() too
        link.shut = true;
        return true;
      }
      moved = true;
      link.outDone += static_cast<size_t>(n);
      if (link.outDone < sizeof(Frame) + payloadBytes) continue;
      link.sending = false;
      if (link.out.kind == Frame::Data) ++link.forwarded;
      if (link.out.kind == Frame::Goodbye || link.out.kind == Frame::Failure) {
        ::shutdown(link.socket.fd(), SHUT_WR);
        link.shut = true;
        return true;
      }
    }
  }

  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace

std::unique_ptr<DeviceTransport> createDevice(const Setup& setup, const std::vector<int>& peers,
                                              std::string*) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  auto transport =
      std::make_unique<TcpDeviceTransport>(*setup.device, setup.deviceIndex, bootstrap.rank(),
                                           bootstrap.size(), setup.slotBytes, setup.slots);
  transport->setUp(bootstrap, peers, setup.deadline);
  return transport;
}

}  // namespace braid::transport::tcp
