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
#include "transports/pages.h"
#include "transports/tcp/tcp_device.h"
#include "transports/wiring.h"
#include "tuning/cost_model.h"

namespace braid::transport::tcp {
namespace {

constexpr uint32_t kPurpose = static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 0;
// Sockets 1, 2, ... of a connection (BRAID_NSOCKS_PERTHREAD), past the
// other transports' purposes.
constexpr uint32_t kMoreSocketsPurpose =
    static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 32;

struct FrameHeader {
  uint32_t bytes;
  uint32_t tag;
};
// A header whose `bytes` has this bit carries a word from the sender instead
// of data, about the rank in the other bits (all ones: none). Its tag says
// which: the sender gives up because that rank failed (kFailed), stopped
// answering (kTimedOut) or revoked the communicator (kRevoked), and this
// is its last word; or the sender is stuck waiting for that rank and goes
// on waiting (kWaitingFor).
constexpr uint32_t kWord = 0x80000000u;
constexpr uint32_t kNoRank = ~kWord;
enum Word : uint32_t { kFailed = 0, kTimedOut = 1, kWaitingFor = 2, kRevoked = 3 };

// One socket of a connection: it carries the messages m with m % sockets
// == its index, in order, as [header | payload] frames (so a step's pieces
// go over every socket at once, and each socket's stream reads like a
// connection of its own). Socket 0 also carries the notices and the
// giving-up word.
struct Stream {
  net::Socket socket;
  // Sending: frames [sent, ...) of this stream's messages are posted and not
  // yet fully written; `offset` bytes of the first one are out. Frames past
  // `limit` are never written (after giving up).
  size_t sent = 0;
  size_t offset = 0;
  size_t limit = ~size_t{0};
  // Receiving: this stream's messages [0, received) are in their slots; the
  // frame being read goes to the next one.
  size_t received = 0;
  FrameHeader header{};
  size_t headerRead = 0;
  size_t payloadRead = 0;
  bool closed = false;    // the peer closed this socket, or gave up on it
  bool wordRead = false;  // ... and that with its last word
  bool wordSent = false;  // this rank gave up on it, and its last word is out
  // Taken over from a retired parent's connection: how many of the peer's
  // last words are still to come before this communicator's frames (the
  // parent's, and its own parent's where the parent was skipping too when
  // it gave up). What comes before them is read and dropped.
  int skipping = 0;
};

class TcpConnection final : public Connection {
 public:
  // Over new sockets, or over streams a retired parent's connection
  // handed over (handOver()).
  TcpConnection(std::vector<net::Socket> sockets, int peer, size_t slotBytes, int slots)
      : TcpConnection(newStreams(std::move(sockets)), peer, slotBytes, slots) {}
  TcpConnection(std::vector<Stream> streams, int peer, size_t slotBytes, int slots)
      : peer_(peer),
        slotBytes_(slotBytes),
        slots_(static_cast<size_t>(slots)),
        streams_(std::move(streams)),
        sendMemory_(slotBytes * slots),
        sendHeaders_(slots),
        recvMemory_(slotBytes * slots),
        recvMessages_(slots),
        iov_(2 * slots) {}

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
  // Nothing more arrives in order once the socket of the next message is
  // closed.
  bool peerClosed() const override { return streams_[recvFilled_ % streams_.size()].closed; }
  int failedRank() const override { return failedRank_; }
  GiveUpReason peerReason() const override { return peerReason_; }
  int peerWaitsFor() const override { return peerWaitsFor_; }

  const Message* peekRecv() override {
    return recvRead_ == recvFilled_ ? nullptr : &recvMessages_[recvRead_ % slots_];
  }
  void releaseRecv() override { ++recvRead_; }

  int peer() const { return peer_; }
  size_t sockets() const { return streams_.size(); }
  int fd(size_t k) const { return streams_[k].socket.fd(); }
  bool closed(size_t k) const { return streams_[k].closed; }

  // Whether a shrunk communicator's connection to the same peer may carry
  // on over these sockets: this rank gave up on each with its whole last
  // word, and nothing broke. (The peer's side must say the same: then its
  // last word arrives on each, after the parent's last frames.)
  bool reusable() const {
    if (!failure_.empty()) return false;
    for (const Stream& stream : streams_)
      if (!stream.socket.valid() || !stream.wordSent || (stream.closed && !stream.wordRead))
        return false;
    return true;
  }

  // The sockets, for a shrunk communicator's connection to the same peer,
  // each with where its parent stopped reading. REQUIRES: reusable(). This
  // connection is done with them.
  std::vector<Stream> handOver() {
    std::vector<Stream> streams(streams_.size());
    for (size_t k = 0; k < streams_.size(); ++k) {
      Stream& before = streams_[k];
      Stream& after = streams[k];
      after.socket = std::move(before.socket);
      after.skipping = before.skipping + (before.wordRead ? 0 : 1);
      after.header = before.header;
      after.headerRead = before.headerRead;
      after.payloadRead = before.payloadRead;
    }
    failure_ = format("the connection to peer %d was handed over to a shrunk communicator", peer_);
    return streams;
  }
  // Whether socket k has a frame or a notice to write / room for a frame.
  bool wantsToSend(size_t k) const { return framesToSend(k) > 0 || (k == 0 && noticeLeft_ > 0); }
  bool wantsToSend() const {
    for (size_t k = 0; k < streams_.size(); ++k)
      if (wantsToSend(k)) return true;
    return false;
  }
  bool canReceive(size_t k) const {
    return !streams_[k].closed && messageOf(k, streams_[k].received) - recvRead_ < slots_;
  }

  // Writes as many posted frames as the sockets take. Returns true if any
  // byte left.
  bool pumpSend() {
    bool moved = false;
    for (size_t k = 0; k < streams_.size(); ++k) moved |= pumpSend(k);
    return moved;
  }

  // Reads frames into free receive slots. Returns true if any byte arrived.
  bool pumpRecv() {
    bool moved = false;
    for (size_t k = 0; k < streams_.size(); ++k) moved |= pumpRecv(k);
    return moved;
  }

  bool pumpSend(size_t k) {
    Stream& stream = streams_[k];
    if (!wantsToSend(k)) return false;
    // A notice goes between frames, never into one.
    if (k == 0 && noticeLeft_ > 0 && stream.offset == 0) {
      const auto* notice = reinterpret_cast<const std::byte*>(&notice_);
      const ssize_t sent = ::send(stream.socket.fd(), notice + sizeof(notice_) - noticeLeft_,
                                  noticeLeft_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent <= 0) return false;  // a broken socket shows on the next frame or receive
      noticeLeft_ -= static_cast<size_t>(sent);
      if (noticeLeft_ > 0 || framesToSend(k) == 0) return true;
    }
    const size_t frames = framesToSend(k);
    if (frames == 0) return false;
    size_t count = 0;
    size_t skip = stream.offset;
    for (size_t i = 0; i < frames; ++i) {
      const size_t m = messageOf(k, stream.sent + i);
      FrameHeader& header = sendHeaders_[m % slots_];
      std::byte* payload = sendMemory_.data() + (m % slots_) * slotBytes_;
      addIov(count, reinterpret_cast<std::byte*>(&header), sizeof(header), skip);
      addIov(count, payload, header.bytes, skip);
    }
    msghdr message{};
    message.msg_iov = iov_.data();
    message.msg_iovlen = count;
    ssize_t sent = ::sendmsg(stream.socket.fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      const int error = errno;
      // A peer that gave up said why before it closed: read that first, so
      // that the op fails naming the rank it blamed.
      try {
        while (!streams_[0].closed && pumpRecv(0)) {
        }
      } catch (const Error&) {
      }
      if (streams_[0].closed && failure_.empty()) {
        for (size_t j = 0; j < streams_.size(); ++j) {  // nobody will read them
          streams_[j].sent = std::max(streams_[j].sent, framesPosted(j));
          streams_[j].offset = 0;
        }
        advanceWritten();
        return true;
      }
      failure_.clear();
      failPeer(format("sending to peer %d failed: %s", peer_, std::strerror(error)));
    }
    size_t left = static_cast<size_t>(sent) + stream.offset;
    for (size_t i = 0; i < frames; ++i) {
      const size_t m = messageOf(k, stream.sent);
      const size_t frame = sizeof(FrameHeader) + sendHeaders_[m % slots_].bytes;
      if (left < frame) break;
      left -= frame;
      ++stream.sent;
    }
    stream.offset = left;
    advanceWritten();
    return sent > 0;
  }

  bool pumpRecv(size_t k) {
    Stream& stream = streams_[k];
    bool moved = false;
    while (canReceive(k)) {
      if (stream.headerRead < sizeof(FrameHeader)) {
        ssize_t got = readSome(k, reinterpret_cast<std::byte*>(&stream.header) + stream.headerRead,
                               sizeof(FrameHeader) - stream.headerRead);
        if (got <= 0) return moved;
        moved = true;
        stream.headerRead += got;
        if (stream.headerRead < sizeof(FrameHeader)) continue;
        const FrameHeader& header = stream.header;
        if (header.bytes & kWord) {
          const uint32_t bits = header.bytes & ~kWord;
          const int rank = bits == kNoRank ? -1 : static_cast<int>(bits);
          stream.headerRead = 0;
          if (stream.skipping > 0) {  // a parent's word: its last words end the skipping
            if (header.tag != kWaitingFor) --stream.skipping;
            if (stream.skipping == 0 && skipped_ > 0)
              BRAID_DEBUG(Net, "peer %d: %zu frame(s) of the shrunk communicator skipped", peer_,
                          skipped_);
            continue;
          }
          if (header.tag == kWaitingFor) {
            peerWaitsFor_ = rank;
            continue;
          }
          failedRank_ = rank;
          stream.wordRead = true;
          peerReason_ = header.tag == kTimedOut  ? GiveUpReason::TimedOut
                        : header.tag == kRevoked ? GiveUpReason::Revoked
                                                 : GiveUpReason::Failed;
          stream.closed = true;
          return true;
        }
        if (header.bytes > slotBytes_)
          failPeer(format("peer %d sent a %u-byte frame, larger than a %zu-byte slot", peer_,
                          header.bytes, slotBytes_));
        stream.payloadRead = 0;
      }
      // (A parent's frame being skipped goes to the slot the next message
      // takes, which is free.)
      const size_t m = messageOf(k, stream.received);
      std::byte* slot = recvMemory_.data() + (m % slots_) * slotBytes_;
      if (stream.payloadRead < stream.header.bytes) {
        ssize_t got =
            readSome(k, slot + stream.payloadRead, stream.header.bytes - stream.payloadRead);
        if (got <= 0) return moved;
        moved = true;
        stream.payloadRead += got;
        if (stream.payloadRead < stream.header.bytes) continue;
      }
      if (stream.skipping > 0) {
        stream.headerRead = 0;
        ++skipped_;
        continue;
      }
      recvMessages_[m % slots_] = {slot, stream.header.bytes, stream.header.tag};
      ++stream.received;
      stream.headerRead = 0;
      // Messages are delivered in order: up to the first not yet here.
      while (recvFilled_ < messageOf(recvFilled_ % streams_.size(),
                                     streams_[recvFilled_ % streams_.size()].received))
        ++recvFilled_;
    }
    return moved;
  }

  // The last word to the peer: finishes the frames partly on the wire (the
  // peer could not parse past them otherwise), drops the other unsent ones
  // and sends the giving-up header on every socket. Waits at most until
  // `deadline` for the sockets to take it. A socket that did not take it is
  // shut down; one that did stays open for a shrunk communicator to carry
  // on over (the peer reads nothing past the word; closing it ends it).
  void giveUp(int failedRank, GiveUpReason reason, Clock::time_point deadline) {
    if (gaveUp_) return;      // one last word, whoever calls again
    if (!failure_.empty()) {  // broken already: nobody to tell
      for (Stream& stream : streams_) ::shutdown(stream.socket.fd(), SHUT_WR);
      return;
    }
    for (Stream& stream : streams_) stream.limit = stream.sent + (stream.offset > 0 ? 1 : 0);
    if (noticeLeft_ == sizeof(notice_)) noticeLeft_ = 0;  // a notice partly sent is finished
    gaveUp_ = true;
    const FrameHeader last = word(failedRank, reason == GiveUpReason::TimedOut  ? kTimedOut
                                              : reason == GiveUpReason::Revoked ? kRevoked
                                                                                : kFailed);
    const auto* bytes = reinterpret_cast<const std::byte*>(&last);
    for (size_t k = 0; k < streams_.size(); ++k) {
      const int fd = streams_[k].socket.fd();
      size_t sent = 0;
      try {
        while (Clock::now() < deadline) {
          if (wantsToSend(k)) {
            pumpSend(k);
          } else {
            const ssize_t n =
                ::send(fd, bytes + sent, sizeof(last) - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) sent += static_cast<size_t>(n);
            if (sent == sizeof(last) || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
          }
          pollfd ready{fd, POLLOUT, 0};
          ::poll(&ready, 1, 10);
        }
      } catch (const Error&) {
        // The peer is gone too.
      }
      streams_[k].wordSent = sent == sizeof(last) && failure_.empty();
      if (!streams_[k].wordSent) ::shutdown(fd, SHUT_WR);
    }
  }

  // Queues the notice that this rank waits for `rank`, to go out on socket
  // 0 ahead of its next frame (replacing one not yet started).
  void noteWaitingFor(int rank) {
    if (gaveUp_) return;  // nothing follows the last word
    if (noticeLeft_ > 0 && noticeLeft_ < sizeof(notice_)) {
      // One is partly out: let it finish first. The newer notice then
      // follows on the next call.
      while (noticeLeft_ > 0 && pumpSend(0)) {
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

  // The connection's message number of socket k's i-th message.
  size_t messageOf(size_t k, size_t i) const { return i * streams_.size() + k; }
  // How many posted frames socket k has left to write.
  size_t framesPosted(size_t k) const {
    const size_t n = streams_.size();
    return sendPosted_ > k ? (sendPosted_ - k + n - 1) / n : 0;
  }
  size_t framesToSend(size_t k) const {
    const size_t end = std::min(framesPosted(k), streams_[k].limit);
    return end > streams_[k].sent ? end - streams_[k].sent : 0;
  }
  // Frees the send slots of messages written on their sockets, in order.
  void advanceWritten() {
    const size_t n = streams_.size();
    while (sendWritten_ < sendPosted_ && sendWritten_ / n < streams_[sendWritten_ % n].sent)
      ++sendWritten_;
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

  // recv() on socket k that returns 0 when nothing is there yet. The peer
  // closing its end between frames is noted, not an error (it may simply
  // be done); closing in the middle of a frame, or a reset, is an error.
  ssize_t readSome(size_t k, std::byte* into, size_t length) {
    Stream& stream = streams_[k];
    ssize_t got = ::recv(stream.socket.fd(), into, length, MSG_DONTWAIT);
    if (got > 0) return got;
    if (got == 0) {
      if (stream.headerRead > 0)
        failPeer(format("peer %d closed the connection in the middle of a message", peer_));
      stream.closed = true;
      return 0;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    failPeer(format("receiving from peer %d failed: %s", peer_, std::strerror(errno)));
  }

  static std::vector<Stream> newStreams(std::vector<net::Socket> sockets) {
    std::vector<Stream> streams(sockets.size());
    for (size_t k = 0; k < sockets.size(); ++k) {
      streams[k].socket = std::move(sockets[k]);
      streams[k].socket.setNonBlocking(true);
      streams[k].socket.setNoDelay();
    }
    return streams;
  }

  int peer_;
  size_t slotBytes_;
  size_t slots_;
  std::vector<Stream> streams_;

  // Send FIFO: messages [sendWritten_, sendPosted_) are posted and not yet
  // fully written (each on its own socket).
  Pages sendMemory_;
  std::vector<FrameHeader> sendHeaders_;
  size_t sendPosted_ = 0;
  size_t sendWritten_ = 0;

  // Receive FIFO: messages [recvRead_, recvFilled_) are unread; later ones
  // may already be in their slots, having come over other sockets.
  Pages recvMemory_;
  std::vector<Message> recvMessages_;
  size_t recvRead_ = 0;
  size_t recvFilled_ = 0;

  int failedRank_ = -1;                             // whom the peer blamed when it gave up
  GiveUpReason peerReason_ = GiveUpReason::Failed;  // ...and why
  int peerWaitsFor_ = -1;   // whom the peer last said it is stuck waiting for
  size_t skipped_ = 0;      // frames of a retired parent's streams read past
  bool gaveUp_ = false;     // this rank sent (or tried to send) its last word
  FrameHeader notice_{};    // this rank's notice to the peer, and
  size_t noticeLeft_ = 0;   // how many of its bytes are still to go out
  std::vector<iovec> iov_;  // preallocated: no allocation per send
  std::string failure_;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(int nranks) : byRank_(nranks, nullptr) {}

  void add(std::unique_ptr<TcpConnection> connection) {
    byRank_[connection->peer()] = connection.get();
    for (size_t k = 0; k < connection->sockets(); ++k) {
      pollFds_.push_back({connection->fd(k), 0, 0});
      polled_.push_back({connection.get(), k});
    }
    connections_.push_back(std::move(connection));
  }

  const char* name() const override { return "tcp"; }
  Connection& connection(int peer) override { return *byRank_[peer]; }
  TcpConnection* tcpConnection(int peer) { return byRank_[peer]; }

  bool progress() override {
    bool moved = false;
    for (auto& connection : connections_)
      if (!connection->failure().empty()) {
        failedPeer_ = connection->peer();
        throw Error(ErrorCode::RemoteError, connection->failure());
      }
    if (polled_.size() <= kPollGate) {
      for (auto& connection : connections_) {
        failedPeer_ = connection->peer();  // if a pump throws, this one failed
        moved |= connection->pumpSend();
        moved |= connection->pumpRecv();
      }
      failedPeer_ = -1;
      return moved;
    }
    // Many sockets: one poll() finds those worth a send or recv call,
    // instead of a call per socket per pass.
    if (!preparePoll()) return false;
    timespec now{0, 0};
    if (::ppoll(pollFds_.data(), pollFds_.size(), &now, nullptr) <= 0) return false;
    for (size_t i = 0; i < polled_.size(); ++i) {
      const short ready = pollFds_[i].revents;
      auto [connection, k] = polled_[i];
      failedPeer_ = connection->peer();
      if (ready & (POLLOUT | POLLERR | POLLHUP)) moved |= connection->pumpSend(k);
      if (ready & (POLLIN | POLLERR | POLLHUP)) moved |= connection->pumpRecv(k);
    }
    failedPeer_ = -1;
    return moved;
  }

  int failedPeer() const override { return failedPeer_; }

  void announceWaitingFor(int rank) override {
    for (auto& connection : connections_)
      if (connection->failure().empty() && !connection->closed(0)) {
        connection->noteWaitingFor(rank);
        try {
          connection->pumpSend(0);
        } catch (const Error&) {
          // progress() reports it.
        }
      }
  }

  void announceFailure(int failedRank, GiveUpReason reason) override {
    const Clock::time_point deadline = Clock::now() + kGiveUpWithin;
    for (auto& connection : connections_) connection->giveUp(failedRank, reason, deadline);
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
  // Up to this many sockets, progress() tries each directly.
  static constexpr size_t kPollGate = 2;
  static constexpr std::chrono::microseconds kIdlePause{200};
  // How long announceFailure() may take, over all connections.
  static constexpr std::chrono::milliseconds kGiveUpWithin{200};
  int failedPeer_ = -1;

  // Sets each socket's poll events from what its connection can do now.
  // Returns false when no socket has anything to wait for.
  bool preparePoll() {
    bool any = false;
    for (size_t i = 0; i < polled_.size(); ++i) {
      auto [connection, k] = polled_[i];
      short events = 0;
      if (connection->wantsToSend(k)) events |= POLLOUT;
      if (connection->canReceive(k)) events |= POLLIN;
      // A closed peer's socket reports POLLHUP forever: leave it out unless
      // there is still something to write (which then fails loudly).
      pollFds_[i].fd = connection->closed(k) && !(events & POLLOUT) ? -1 : connection->fd(k);
      pollFds_[i].events = events;
      pollFds_[i].revents = 0;
      any |= events != 0;
    }
    return any;
  }

  std::vector<std::unique_ptr<TcpConnection>> connections_;
  std::vector<TcpConnection*> byRank_;
  std::vector<pollfd> pollFds_;
  std::vector<std::pair<TcpConnection*, size_t>> polled_;  // connection, socket of each pollFd
};

}  // namespace

namespace {

// After a shrink: for each of `peers`, the parent's connection to it whose
// sockets this rank's connection carries on over, or null where it makes
// new ones. Collective over the shrunk communicator (every rank of it has a
// parent): a pair carries on where both ends can.
std::vector<TcpConnection*> takeOvers(bootstrap::Bootstrap& bootstrap,
                                      const std::vector<int>& peers, int sockets,
                                      const Parent& parent, net::Deadline deadline) {
  const int n = bootstrap.size();
  const size_t rowBytes = (static_cast<size_t>(n) + 7) / 8;
  std::vector<uint8_t> can(rowBytes * n, 0);  // rank r's row: the peers it can carry on with
  std::vector<TcpConnection*> before(static_cast<size_t>(n), nullptr);
  for (int peer : peers) {
    if (!parent.retired) break;
    auto* tcp = dynamic_cast<TcpTransport*>(parent.wiring.transportOf[parent.ranks[peer]]);
    TcpConnection* connection = tcp ? tcp->tcpConnection(parent.ranks[peer]) : nullptr;
    if (!connection || connection->sockets() != static_cast<size_t>(sockets) ||
        !connection->reusable())
      continue;
    before[peer] = connection;
    can[rowBytes * bootstrap.rank() + peer / 8] |= static_cast<uint8_t>(1u << peer % 8);
  }
  bootstrap.allGather(can.data(), rowBytes, deadline);
  auto says = [&](int r, int peer) { return (can[rowBytes * r + peer / 8] >> peer % 8) & 1; };
  std::vector<TcpConnection*> taken(peers.size(), nullptr);
  for (size_t i = 0; i < peers.size(); ++i)
    if (says(bootstrap.rank(), peers[i]) && says(peers[i], bootstrap.rank()))
      taken[i] = before[peers[i]];
  return taken;
}

}  // namespace

std::unique_ptr<Transport> connectPeers(bootstrap::Bootstrap& bootstrap,
                                        const std::vector<int>& peers, size_t slotBytes, int slots,
                                        int sockets, net::Deadline deadline, const Parent* parent) {
  auto transport = std::make_unique<TcpTransport>(bootstrap.size());
  const int rank = bootstrap.rank();
  std::vector<TcpConnection*> taken(peers.size(), nullptr);
  if (parent) taken = takeOvers(bootstrap, peers, sockets, *parent, deadline);
  // Socket k of a pair has its own purpose, so the pair's sockets pair up
  // alike at both ends.
  auto purpose = [](int k) { return k == 0 ? kPurpose : kMoreSocketsPurpose + k; };
  // Connect upwards first, then accept from below: a connect completes in
  // the listener's backlog, so no pair waits on the other.
  std::vector<std::pair<int, std::vector<net::Socket>>> connected;
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i] > rank && !taken[i]) {
      connected.emplace_back(peers[i], std::vector<net::Socket>{});
      for (int k = 0; k < sockets; ++k)
        connected.back().second.push_back(bootstrap.connectTo(peers[i], purpose(k), deadline));
    }
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i] < rank && !taken[i]) {
      connected.emplace_back(peers[i], std::vector<net::Socket>{});
      for (int k = 0; k < sockets; ++k)
        connected.back().second.push_back(bootstrap.acceptFrom(peers[i], purpose(k), deadline));
    }
  for (auto& [peer, socketsOfPeer] : connected) {
    BRAID_DEBUG(Net, "connected to peer %d (%s), %d socket(s)", peer,
                socketsOfPeer[0].peerAddress().toString().c_str(), sockets);
    transport->add(
        std::make_unique<TcpConnection>(std::move(socketsOfPeer), peer, slotBytes, slots));
  }
  for (size_t i = 0; i < peers.size(); ++i)
    if (taken[i]) {
      BRAID_DEBUG(Net, "peer %d: carrying on over the shrunk communicator's %d socket(s)", peers[i],
                  sockets);
      transport->add(
          std::make_unique<TcpConnection>(taken[i]->handOver(), peers[i], slotBytes, slots));
    }
  return transport;
}

TransportEntry entry() {
  TransportEntry entry(
      "tcp", Reach::AnyHost,
      "stream sockets to any host (BRAID_NSOCKS_PERTHREAD per peer); device buffers "
      "staged through host memory");
  entry.create = [](const Setup& setup, const std::vector<int>& peers,
                    std::string*) -> std::unique_ptr<Transport> {
    return connectPeers(setup.bootstrap, peers, setup.slotBytes, setup.slots, setup.knobs.sockets,
                        setup.deadline, setup.parent);
  };
  entry.createDevice = createDevice;
  entry.hostLink = tuning::hostLinkModel(15e-6, 3e9);
  // The stream operations of a mapped FIFO around a network hop.
  entry.deviceLink = tuning::deviceLinkModel(25e-6, 3e9);
  return entry;
}

}  // namespace braid::transport::tcp
