#include "transports/tcp/tcp_device.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "bootstrap/agree.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::transport::tcp {
namespace {

// (kTransportBase + 0 is the host transport's sockets.)
constexpr uint32_t kPurpose = static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 1;

// A block: the four counters, each on a line of its own, the slots' tag
// and length words (at most 64 slots), then the send slots and the
// receive slots.
constexpr size_t kSendFilled = 0;    // written by this rank's stream, read by the proxy
constexpr size_t kSendCredit = 64;   // written by the proxy, waited on by the stream
constexpr size_t kRecvFilled = 128;  // written by the proxy, waited on by the stream
constexpr size_t kRecvCredit = 192;  // written by the stream, read by the proxy
constexpr size_t kSendTags = 512;
constexpr size_t kSendLengths = 768;
constexpr size_t kRecvTags = 1024;
constexpr size_t kSlotsOffset = 4096;

// Everything on the socket is a frame; a Data frame's payload follows it.
struct Frame {
  enum Kind : uint32_t { Data = 1, Credit = 2, Goodbye = 3, Failure = 4, WaitingFor = 5 };
  uint32_t kind = 0;
  uint32_t tag = 0;    // Data: the op's tag
  uint32_t bytes = 0;  // Data: the payload's length; Failure: 1 when the sender timed out
  int32_t value = 0;   // Credit: the counter; Failure: the rank blamed; WaitingFor: the rank
};

// What two ends check of each other first.
struct Hello {
  uint64_t slotBytes;
  int32_t slots;
  int32_t rank;
};

uint32_t* word(std::byte* block, size_t offset) {
  return reinterpret_cast<uint32_t*>(block + offset);
}
uint32_t load(const uint32_t* flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }
uint32_t low(uint64_t counter) { return static_cast<uint32_t>(counter); }

// How long a rank that leaves waits for its last messages to go out, and
// one that gives up for its last word.
constexpr auto kDrainWait = std::chrono::seconds(10);
constexpr auto kNoticeWait = std::chrono::milliseconds(200);

constexpr const char* kSettingUp = "set up device staging";

class TcpDeviceTransport final : public DeviceTransport {
 public:
  TcpDeviceTransport(device::Device& device, int rank, int nranks, size_t slotBytes, int slots)
      : device_(device),
        rank_(rank),
        slotBytes_(slotBytes),
        slots_(static_cast<uint64_t>(slots)),
        byPeer_(static_cast<size_t>(nranks), nullptr),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (wake_ < 0)
      throw Error(ErrorCode::SystemError,
                  format("braid rank %d: tcp: eventfd: %s", rank, std::strerror(errno)));
  }

  ~TcpDeviceTransport() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake();
    if (proxy_.joinable()) proxy_.join();
    ::close(wake_);
    for (auto& link : links_) {
      if (!link->block || kept_) continue;
      try {
        device_.free(link->block);
      } catch (const Error& error) {
        BRAID_WARN(Exec, "tcp: freeing a device staging block failed: %s", error.what());
      }
    }
  }

  size_t blockBytes() const { return kSlotsOffset + 2 * slotBytes_ * slots_; }

  void setUp(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
             net::Deadline deadline) {
    for (int peer : peers) {
      links_.push_back(std::make_unique<Link>());
      links_.back()->peer = peer;
      byPeer_[static_cast<size_t>(peer)] = links_.back().get();
    }
    // Memory, then the sockets: upwards first (a connect never waits for
    // the accept), then from below.
    bootstrap::agree(bootstrap, deadline, "tcp", kSettingUp, [&] {
      for (auto& link : links_) {
        link->block = static_cast<std::byte*>(device_.allocateHost(blockBytes()));
        wire(*link);
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
    if (!links_.empty()) proxy_ = std::thread([this] { run(); });
  }

  // ---- DeviceTransport.

  size_t slotBytes() const override { return slotBytes_; }
  int slots() const override { return static_cast<int>(slots_); }

  DeviceConnection* connection(int peer) override {
    Link* link = byPeer_[static_cast<size_t>(peer)];
    return link ? &link->connection : nullptr;
  }

  std::string path(int peer) const override {
    return byPeer_[static_cast<size_t>(peer)] ? "tcp: staged through host memory" : "none";
  }

  void enqueued() override {
    for (auto& link : links_) {
      link->sendsDue.store(link->connection.send.next, std::memory_order_seq_cst);
      link->receivesDue.store(link->connection.recv.next, std::memory_order_seq_cst);
    }
    if (sleeping_.load(std::memory_order_seq_cst)) wake();
  }

  void poll(std::vector<PeerNotice>* notices) override {
    std::lock_guard<std::mutex> lock(mutex_);
    notices->insert(notices->end(), heard_.begin(), heard_.end());
    heard_.clear();
  }

  void announceFailure(int failedRank, bool timedOut) override {
    Frame frame;
    frame.kind = Frame::Failure;
    frame.value = failedRank;
    frame.bytes = timedOut ? 1 : 0;
    std::unique_lock<std::mutex> lock(mutex_);
    quiet_ = true;  // the streams were released: nothing they write means anything now
    for (auto& link : links_) link->outbox.push_back(frame);
    lock.unlock();
    wake();
    // A peer trusts this rank's released streams only once it heard that
    // this rank gave up: a socket that takes no last word is shut instead.
    lock.lock();
    if (!changed_.wait_for(lock, kNoticeWait, [&] { return allShut(); }))
      for (auto& link : links_)
        if (!link->shut) ::shutdown(link->socket.fd(), SHUT_RDWR);
  }

  void sayGoodbye() override {
    std::unique_lock<std::mutex> lock(mutex_);
    for (auto& link : links_) link->goodbyeDue = true;
    lock.unlock();
    wake();
    lock.lock();
    if (!changed_.wait_for(lock, kDrainWait, [&] { return allShut(); }))
      BRAID_WARN(Exec,
                 "braid rank %d: tcp: device messages to some peer were still not sent after "
                 "%lld s; leaving without them",
                 rank_, static_cast<long long>(kDrainWait.count()));
  }

  void keepMemory() override { kept_ = true; }

  void announceWaitingFor(int rank) override {
    Frame frame;
    frame.kind = Frame::WaitingFor;
    frame.value = rank;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& link : links_) link->outbox.push_back(frame);
    }
    wake();
  }

  int peerWaitsFor(int peer) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Link* link = byPeer_[static_cast<size_t>(peer)];
    return link ? link->waitsFor : -1;
  }

 private:
  struct Link {
    int peer = -1;
    net::Socket socket;
    std::byte* block = nullptr;
    DeviceConnection connection;
    // From enqueued(): messages this rank's streams will send and receive.
    std::atomic<uint64_t> sendsDue{0};
    std::atomic<uint64_t> receivesDue{0};

    // The proxy's (mutex_ held).
    uint64_t forwarded = 0;   // messages whose frame went out whole
    uint64_t received = 0;    // messages that arrived whole
    uint32_t creditSent = 0;  // the last credit the peer was told
    Frame out;                // the frame going out...
    const std::byte* payload = nullptr;
    size_t outDone = 0;    // ...and how much of it (header and payload) left
    bool sending = false;  // `out` is one
    bool blocked = false;  // the socket took no more: poll for POLLOUT
    Frame in;              // the frame coming in, and how much of it arrived
    size_t inDone = 0;
    std::deque<Frame> outbox;  // side-channel words to send (before any more data)
    bool goodbyeDue = false;   // say goodbye once every message went out
    bool shut = false;         // this rank sends nothing more
    bool closed = false;       // nothing more arrives: the peer left or died
    bool goodbye = false;      // it said goodbye first
    int waitsFor = -1;
  };

  void wire(Link& link) {
    DeviceConnection& c = link.connection;
    std::byte* b = link.block;
    c.peer = link.peer;
    c.send.slots = b + kSlotsOffset;
    c.send.tags = word(b, kSendTags);
    c.send.lengths = word(b, kSendLengths);
    c.send.filled = word(b, kSendFilled);
    c.send.credit = word(b, kSendCredit);
    c.recv.slots = b + kSlotsOffset + slotBytes_ * slots_;
    c.recv.tags = word(b, kRecvTags);
    c.recv.filled = word(b, kRecvFilled);
    c.recv.credit = word(b, kRecvCredit);
  }

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }

  // Links on which this rank sends nothing more.
  size_t settled() const {
    return static_cast<size_t>(std::count_if(
        links_.begin(), links_.end(), [](const auto& link) { return link->shut || link->closed; }));
  }
  bool allShut() const { return settled() == links_.size(); }

  // ---- The proxy thread.

  void run() {
    // Its sleeps are a few microseconds while messages are due: with the
    // default slack of 50 us they would all be 50 us.
    ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    std::vector<pollfd> fds;
    int idle = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      const size_t settledBefore = settled();
      if (turn()) {
        idle = 0;
        if (settled() != settledBefore) changed_.notify_all();  // (sayGoodbye, announceFailure)
        continue;
      }
      fds.clear();
      fds.push_back({wake_, POLLIN, 0});
      for (auto& link : links_) {
        if (link->closed) continue;
        fds.push_back({link->socket.fd(),
                       static_cast<short>(POLLIN | (link->blocked && !link->shut ? POLLOUT : 0)),
                       0});
      }
      // While the streams owe messages, look at their words again soon
      // (a few microseconds, growing); otherwise sleep until a socket or
      // enqueued() wakes this thread.
      sleeping_.store(true, std::memory_order_seq_cst);
      const bool due = owed();
      if (due) sleeping_.store(false, std::memory_order_seq_cst);
      timespec wait{0, 0};
      if (!due)
        wait.tv_nsec = 100'000'000;
      else if (idle > 4)
        wait.tv_nsec = 1000L << std::min(idle - 4, 4);  // 2 us ... 16 us
      ++idle;
      lock.unlock();
      const int ready = ::ppoll(fds.data(), fds.size(), &wait, nullptr);
      if (ready > 0 && fds[0].revents) {
        uint64_t count;
        (void)!::read(wake_, &count, sizeof(count));
      }
      lock.lock();
      sleeping_.store(false, std::memory_order_seq_cst);
      if (ready > 0) idle = 0;
    }
  }

  // Whether this rank's streams will write words the proxy must forward.
  bool owed() const {
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
  bool turn() {
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
        heard_.push_back({link.peer, frame.value, false, false, false, -1, false});
        return true;
      case Frame::Failure:  // reported as a close: nothing the peer sends matters now
        link.closed = true;
        heard_.push_back({link.peer, -1, true, false, true, frame.value, frame.bytes != 0});
        return false;
      default:
        lost(link, "sent a frame braid does not know");
        return false;
    }
  }

  void lost(Link& link, const char* why) {
    if (!link.goodbye) BRAID_DEBUG(Exec, "tcp: device connection to rank %d: %s", link.peer, why);
    link.closed = true;
    heard_.push_back({link.peer, -1, true, link.goodbye, false, -1, false});
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

  device::Device& device_;
  const int rank_;
  const size_t slotBytes_;
  const uint64_t slots_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<Link*> byPeer_;          // indexed by rank; null for peers tcp does not serve here
  const int wake_;                     // eventfd: enqueued() and the side channel wake the proxy
  std::atomic<bool> sleeping_{false};  // the proxy sleeps with no message due
  std::atomic<bool> kept_{false};      // keepMemory(): the blocks are never freed

  mutable std::mutex mutex_;         // guards the links' proxy state and what follows
  std::condition_variable changed_;  // a link shut or closed
  std::vector<PeerNotice> heard_;    // for poll()
  bool quiet_ = false;               // this rank gave up: forward nothing more
  bool stopping_ = false;
  std::thread proxy_;  // last: started once the rest is built
};

}  // namespace

std::unique_ptr<DeviceTransport> createDevice(bootstrap::Bootstrap& bootstrap,
                                              const std::vector<int>& peers, device::Device& device,
                                              size_t slotBytes, int slots, net::Deadline deadline) {
  auto transport = std::make_unique<TcpDeviceTransport>(device, bootstrap.rank(), bootstrap.size(),
                                                        slotBytes, slots);
  transport->setUp(bootstrap, peers, deadline);
  return transport;
}

}  // namespace braid::transport::tcp
