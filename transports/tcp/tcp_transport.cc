#include "transports/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::transport::tcp {
namespace {

constexpr uint32_t kPurpose = static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 0;

struct FrameHeader {
  uint32_t bytes;
  uint32_t tag;
};
// A header whose `bytes` has this bit carries a word from the sender instead
// of data, about the rank in the other bits (all ones: none). Its tag says
// which: the sender gives up because that rank failed (kFailed) or stopped
// answering (kTimedOut), and this is its last word; or the sender is stuck
// waiting for that rank and goes on waiting (kWaitingFor).
constexpr uint32_t kWord = 0x80000000u;
constexpr uint32_t kNoRank = ~kWord;
enum Word : uint32_t { kFailed = 0, kTimedOut = 1, kWaitingFor = 2 };

class TcpConnection final : public Connection {
 public:
  TcpConnection(net::Socket socket, int peer, size_t slotBytes, int slots)
      : socket_(std::move(socket)),
        peer_(peer),
        slotBytes_(slotBytes),
        slots_(static_cast<size_t>(slots)),
        sendMemory_(slotBytes * slots),
        sendHeaders_(slots),
        recvMemory_(slotBytes * slots),
        recvMessages_(slots),
        iov_(2 * slots) {
    socket_.setNonBlocking(true);
    socket_.setNoDelay();
  }

  size_t slotBytes() const override { return slotBytes_; }

  std::byte* sendSlot(size_t) override {
    if (sendPosted_ - sendWritten_ == slots_) return nullptr;
    return sendMemory_.data() + (sendPosted_ % slots_) * slotBytes_;
  }
  void postSend(uint32_t bytes, uint32_t tag) override {
    sendHeaders_[sendPosted_ % slots_] = {bytes, tag};
    ++sendPosted_;
  }
  bool flushed() const override { return sendWritten_ == sendPosted_; }
  bool peerClosed() const override { return closed_; }
  int failedRank() const override { return failedRank_; }
  bool peerTimedOut() const override { return peerTimedOut_; }
  int peerWaitsFor() const override { return peerWaitsFor_; }

  const Message* peekRecv() override {
    return recvRead_ == recvFilled_ ? nullptr : &recvMessages_[recvRead_ % slots_];
  }
  void releaseRecv() override { ++recvRead_; }

  int fd() const { return socket_.fd(); }
  int peer() const { return peer_; }
  bool closed() const { return closed_; }
  bool wantsToSend() const { return sendWritten_ != sendPosted_ || noticeLeft_ > 0; }
  bool canReceive() const { return !closed_ && recvFilled_ - recvRead_ < slots_; }

  // Writes as many posted frames as the socket takes. Returns true if any
  // byte left.
  bool pumpSend() {
    if (!wantsToSend()) return false;
    // A notice goes between frames, never into one.
    if (noticeLeft_ > 0 && sendOffset_ == 0) {
      const auto* notice = reinterpret_cast<const std::byte*>(&notice_);
      const ssize_t sent = ::send(socket_.fd(), notice + sizeof(notice_) - noticeLeft_, noticeLeft_,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent <= 0) return false;  // a broken socket shows on the next frame or receive
      noticeLeft_ -= static_cast<size_t>(sent);
      if (noticeLeft_ > 0 || sendWritten_ == sendPosted_) return true;
    }
    if (sendWritten_ == sendPosted_) return false;
    size_t count = 0;
    size_t skip = sendOffset_;
    for (size_t m = sendWritten_; m != sendPosted_; ++m) {
      FrameHeader& header = sendHeaders_[m % slots_];
      std::byte* payload = sendMemory_.data() + (m % slots_) * slotBytes_;
      addIov(count, reinterpret_cast<std::byte*>(&header), sizeof(header), skip);
      addIov(count, payload, header.bytes, skip);
    }
    msghdr message{};
    message.msg_iov = iov_.data();
    message.msg_iovlen = count;
    ssize_t sent = ::sendmsg(socket_.fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      const int error = errno;
      // A peer that gave up said why before it closed: read that first, so
      // that the op fails naming the rank it blamed.
      try {
        while (!closed_ && pumpRecv()) {
        }
      } catch (const Error&) {
      }
      if (closed_ && failure_.empty()) {
        sendWritten_ = sendPosted_;  // nobody will read them
        sendOffset_ = 0;
        return true;
      }
      failure_.clear();
      failPeer(format("sending to peer %d failed: %s", peer_, std::strerror(error)));
    }
    size_t left = static_cast<size_t>(sent) + sendOffset_;
    while (sendWritten_ != sendPosted_) {
      size_t frame = sizeof(FrameHeader) + sendHeaders_[sendWritten_ % slots_].bytes;
      if (left < frame) break;
      left -= frame;
      ++sendWritten_;
    }
    sendOffset_ = left;
    return sent > 0;
  }

  // Reads frames into free receive slots. Returns true if any byte arrived.
  bool pumpRecv() {
    bool moved = false;
    while (canReceive()) {
      if (headerRead_ < sizeof(FrameHeader)) {
        ssize_t got = readSome(reinterpret_cast<std::byte*>(&header_) + headerRead_,
                               sizeof(FrameHeader) - headerRead_);
        if (got <= 0) return moved;
        moved = true;
        headerRead_ += got;
        if (headerRead_ < sizeof(FrameHeader)) continue;
        if (header_.bytes & kWord) {
          const uint32_t bits = header_.bytes & ~kWord;
          const int rank = bits == kNoRank ? -1 : static_cast<int>(bits);
          headerRead_ = 0;
          if (header_.tag == kWaitingFor) {
            peerWaitsFor_ = rank;
            continue;
          }
          failedRank_ = rank;
          peerTimedOut_ = header_.tag == kTimedOut;
          closed_ = true;
          return true;
        }
        if (header_.bytes > slotBytes_)
          failPeer(format("peer %d sent a %u-byte frame, larger than a %zu-byte slot", peer_,
                          header_.bytes, slotBytes_));
        payloadRead_ = 0;
      }
      std::byte* slot = recvMemory_.data() + (recvFilled_ % slots_) * slotBytes_;
      if (payloadRead_ < header_.bytes) {
        ssize_t got = readSome(slot + payloadRead_, header_.bytes - payloadRead_);
        if (got <= 0) return moved;
        moved = true;
        payloadRead_ += got;
        if (payloadRead_ < header_.bytes) continue;
      }
      recvMessages_[recvFilled_ % slots_] = {slot, header_.bytes, header_.tag};
      ++recvFilled_;
      headerRead_ = 0;
    }
    return moved;
  }

  // The last word to the peer: finishes the frame partly on the wire (the
  // peer could not parse past it otherwise), drops the other unsent ones,
  // sends the giving-up header and shuts down this direction. Waits at most
  // until `deadline` for the socket to take it.
  void giveUp(int failedRank, bool timedOut, Clock::time_point deadline) {
    if (!failure_.empty()) {  // broken already: nobody to tell
      ::shutdown(socket_.fd(), SHUT_WR);
      return;
    }
    sendPosted_ = sendWritten_ + (sendOffset_ > 0 ? 1 : 0);
    if (noticeLeft_ == sizeof(notice_)) noticeLeft_ = 0;  // a notice partly sent is finished
    const FrameHeader last = word(failedRank, timedOut ? kTimedOut : kFailed);
    const auto* bytes = reinterpret_cast<const std::byte*>(&last);
    size_t sent = 0;
    try {
      while (Clock::now() < deadline) {
        if (wantsToSend()) {
          pumpSend();
        } else {
          const ssize_t n =
              ::send(socket_.fd(), bytes + sent, sizeof(last) - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0) sent += static_cast<size_t>(n);
          if (sent == sizeof(last) || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
        }
        pollfd ready{socket_.fd(), POLLOUT, 0};
        ::poll(&ready, 1, 10);
      }
    } catch (const Error&) {
      // The peer is gone too.
    }
    ::shutdown(socket_.fd(), SHUT_WR);
  }

  // Queues the notice that this rank waits for `rank`, to go out ahead of
  // the next frame (replacing one not yet started).
  void noteWaitingFor(int rank) {
    if (noticeLeft_ > 0 && noticeLeft_ < sizeof(notice_)) {
      // One is partly out: let it finish first. The newer notice then
      // follows on the next call.
      while (noticeLeft_ > 0 && pumpSend()) {
      }
      if (noticeLeft_ > 0) return;
    }
    notice_ = word(rank, kWaitingFor);
    noticeLeft_ = sizeof(notice_);
  }

  [[noreturn]] void failPeer(const std::string& why) {
    failure_ = why;
    throw Error(ErrorCode::RemoteError, why);
  }
  const std::string& failure() const { return failure_; }

 private:
  static FrameHeader word(int rank, Word what) {
    return {kWord | (rank < 0 ? kNoRank : static_cast<uint32_t>(rank)), what};
  }

  void addIov(size_t& count, std::byte* base, size_t length, size_t& skip) {
    if (skip >= length) {
      skip -= length;
      return;
    }
    iov_[count].iov_base = base + skip;
    iov_[count].iov_len = length - skip;
    skip = 0;
    ++count;
  }

  // recv() that returns 0 when nothing is there yet. The peer closing its
  // end between frames is noted, not an error (it may simply be done);
  // closing in the middle of a frame, or a reset, is an error.
  ssize_t readSome(std::byte* into, size_t length) {
    ssize_t got = ::recv(socket_.fd(), into, length, MSG_DONTWAIT);
    if (got > 0) return got;
    if (got == 0) {
      if (headerRead_ > 0)
        failPeer(format("peer %d closed the connection in the middle of a message", peer_));
      closed_ = true;
      return 0;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    failPeer(format("receiving from peer %d failed: %s", peer_, std::strerror(errno)));
  }

  net::Socket socket_;
  int peer_;
  size_t slotBytes_;
  size_t slots_;

  // Send FIFO: slots [sendWritten_, sendPosted_) are posted and not yet
  // fully written; sendOffset_ bytes of the first one are already out.
  std::vector<std::byte> sendMemory_;
  std::vector<FrameHeader> sendHeaders_;
  size_t sendPosted_ = 0;
  size_t sendWritten_ = 0;
  size_t sendOffset_ = 0;

  // Receive FIFO: slots [recvRead_, recvFilled_) hold unread messages; the
  // frame being read goes to slot recvFilled_.
  std::vector<std::byte> recvMemory_;
  std::vector<Message> recvMessages_;
  size_t recvRead_ = 0;
  size_t recvFilled_ = 0;
  FrameHeader header_{};
  size_t headerRead_ = 0;
  size_t payloadRead_ = 0;

  bool closed_ = false;        // the peer closed its end
  int failedRank_ = -1;        // whom the peer blamed when it gave up
  bool peerTimedOut_ = false;  // ... because it waited for that rank too long
  int peerWaitsFor_ = -1;      // whom the peer last said it is stuck waiting for
  FrameHeader notice_{};       // this rank's notice to the peer, and
  size_t noticeLeft_ = 0;      // how many of its bytes are still to go out
  std::vector<iovec> iov_;     // preallocated: no allocation per send
  std::string failure_;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(int nranks) : byRank_(nranks, nullptr) {}

  void add(std::unique_ptr<TcpConnection> connection) {
    byRank_[connection->peer()] = connection.get();
    pollFds_.push_back({connection->fd(), 0, 0});
    connections_.push_back(std::move(connection));
  }

  const char* name() const override { return "tcp"; }
  Connection& connection(int peer) override { return *byRank_[peer]; }

  bool progress() override {
    bool moved = false;
    for (auto& connection : connections_)
      if (!connection->failure().empty()) {
        failedPeer_ = connection->peer();
        throw Error(ErrorCode::RemoteError, connection->failure());
      }
    if (connections_.size() <= kPollGate) {
      for (auto& connection : connections_) {
        failedPeer_ = connection->peer();  // if a pump throws, this one failed
        moved |= connection->pumpSend();
        moved |= connection->pumpRecv();
      }
      failedPeer_ = -1;
      return moved;
    }
    // Many peers: one poll() finds the sockets worth a send or recv call,
    // instead of a call per socket per pass.
    if (!preparePoll()) return false;
    timespec now{0, 0};
    if (::ppoll(pollFds_.data(), pollFds_.size(), &now, nullptr) <= 0) return false;
    for (size_t i = 0; i < connections_.size(); ++i) {
      const short ready = pollFds_[i].revents;
      failedPeer_ = connections_[i]->peer();
      if (ready & (POLLOUT | POLLERR | POLLHUP)) moved |= connections_[i]->pumpSend();
      if (ready & (POLLIN | POLLERR | POLLHUP)) moved |= connections_[i]->pumpRecv();
    }
    failedPeer_ = -1;
    return moved;
  }

  int failedPeer() const override { return failedPeer_; }

  void announceWaitingFor(int rank) override {
    for (auto& connection : connections_)
      if (connection->failure().empty() && !connection->closed()) {
        connection->noteWaitingFor(rank);
        try {
          connection->pumpSend();
        } catch (const Error&) {
          // progress() reports it.
        }
      }
  }

  void announceFailure(int failedRank, bool timedOut) override {
    const Clock::time_point deadline = Clock::now() + kGiveUpWithin;
    for (auto& connection : connections_) connection->giveUp(failedRank, timedOut, deadline);
  }

  void waitForActivity(Clock::time_point until) override {
    auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now());
    if (wait.count() <= 0) return;
    if (!preparePoll()) {  // nothing a socket could change: just pause
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(wait, kIdlePause));
      return;
    }
    timespec timeout{static_cast<time_t>(wait.count() / 1000000000),
                     static_cast<long>(wait.count() % 1000000000)};
    ::ppoll(pollFds_.data(), pollFds_.size(), &timeout, nullptr);
  }

 private:
  // Up to this many peers, progress() tries each socket directly.
  static constexpr size_t kPollGate = 2;
  static constexpr std::chrono::microseconds kIdlePause{200};
  // How long announceFailure() may take, over all connections.
  static constexpr std::chrono::milliseconds kGiveUpWithin{200};
  int failedPeer_ = -1;

  // Sets each socket's poll events from what its connection can do now.
  // Returns false when no socket has anything to wait for.
  bool preparePoll() {
    bool any = false;
    for (size_t i = 0; i < connections_.size(); ++i) {
      short events = 0;
      if (connections_[i]->wantsToSend()) events |= POLLOUT;
      if (connections_[i]->canReceive()) events |= POLLIN;
      // A closed peer's socket reports POLLHUP forever: leave it out unless
      // there is still something to write (which then fails loudly).
      pollFds_[i].fd =
          connections_[i]->closed() && !(events & POLLOUT) ? -1 : connections_[i]->fd();
      pollFds_[i].events = events;
      pollFds_[i].revents = 0;
      any |= events != 0;
    }
    return any;
  }

  std::vector<std::unique_ptr<TcpConnection>> connections_;
  std::vector<TcpConnection*> byRank_;
  std::vector<pollfd> pollFds_;
};

}  // namespace

std::unique_ptr<Transport> create(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
                                  size_t slotBytes, int slots, net::Deadline deadline) {
  auto transport = std::make_unique<TcpTransport>(bootstrap.size());
  const int rank = bootstrap.rank();
  // Connect upwards first, then accept from below: a connect completes in
  // the listener's backlog, so no pair waits on the other.
  std::vector<std::pair<int, net::Socket>> sockets;
  for (int peer : peers)
    if (peer > rank) sockets.emplace_back(peer, bootstrap.connectTo(peer, kPurpose, deadline));
  for (int peer : peers)
    if (peer < rank) sockets.emplace_back(peer, bootstrap.acceptFrom(peer, kPurpose, deadline));
  for (auto& [peer, socket] : sockets) {
    BRAID_DEBUG(Tcp, "connected to peer %d (%s)", peer, socket.peerAddress().toString().c_str());
    transport->add(std::make_unique<TcpConnection>(std::move(socket), peer, slotBytes, slots));
  }
  return transport;
}

}  // namespace braid::transport::tcp
