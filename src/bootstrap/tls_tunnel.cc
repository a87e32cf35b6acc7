// The tunnel (tls.h): one thread per process and one epoll set over every
// encrypted connection's two sockets, the TCP one and the tunnel's end of a
// local socket pair. Each link moves plaintext from the local end into TLS
// records on the TCP socket, and records from the TCP socket into plaintext
// on the local end, a buffer each way; a full buffer stops reading its
// source, so a slow reader slows the writer as a kernel buffer would.
//
// System calls are batched: SSL writes its records into memory, and the
// tunnel sends them many at a time (`wire`); it reads records ahead, many
// per call.
//
// Both sockets are registered once, edge-triggered, and any event on either
// pumps the whole link until nothing moves: every step is tried each time,
// so no event needs to say which step it was for.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/tls.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

#if BRAID_HAVE_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

namespace braid::net {

// What a Socket holds of its link. Closing the local end waits until the
// tunnel has handed what was written there to the TCP socket, where the
// kernel sends it even if this process ends at once (as after a plaintext
// close), or until nothing can move (the peer has not finished the
// handshake, or reads nothing): then the tunnel sends it in the background
// while the process lives, as a kernel buffer would. At most kFlushWithin.
class TunnelEnd {
 public:
  TunnelEnd() : owner_(::getpid()) {}
  // A child of fork() that closes an inherited socket just closes its
  // descriptor: shutting the socket down would end the parent's connection.
  bool ownedHere() const { return owner_ == ::getpid(); }
  void markFlushed() {
    std::lock_guard<std::mutex> lock(mutex_);
    flushed_ = true;
    changed_.notify_all();
  }
  void waitFlushed(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, deadline, [&] { return flushed_; });
  }

 private:
  const pid_t owner_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool flushed_ = false;
};

void closeTunnelled(int fd, TunnelEnd& end) {
  constexpr auto kFlushWithin = std::chrono::seconds(1);
  if (!end.ownedHere()) return;
  ::shutdown(fd, SHUT_WR);
  end.waitFlushed(Clock::now() + kFlushWithin);
}

#if BRAID_HAVE_TLS
namespace {

constexpr size_t kBufferBytes = 256 * 1024;
// Plaintext encrypted per turn (TLS cuts it into records of 16 KiB).
constexpr size_t kEncryptBytes = 64 * 1024;
// How much SSL reads from the TCP socket per call.
constexpr size_t kReadAheadBytes = 128 * 1024;
// Turns of one link's pump before the others get theirs.
constexpr int kTurnsPerPump = 16;
// A link whose caller closed its end before the handshake ended is dropped
// this long after it was made (a peer that connects and stays silent).
constexpr auto kAbandonedHandshake = std::chrono::seconds(5);

// Bytes on their way, in one direction.
class Buffer {
 public:
  bool empty() const { return begin_ == end_; }
  size_t size() const { return end_ - begin_; }
  size_t room() const { return bytes_ ? kBufferBytes - end_ : kBufferBytes; }
  uint8_t* head() { return bytes_.get() + begin_; }
  uint8_t* tail() {
    if (!bytes_) bytes_ = std::make_unique<uint8_t[]>(kBufferBytes);
    return bytes_.get() + end_;
  }
  void added(size_t n) { end_ += n; }
  void taken(size_t n) {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  // Moves what is left to the front, so that room() counts all free bytes.
  void compact() {
    if (begin_ == 0 || !bytes_) return;
    std::memmove(bytes_.get(), bytes_.get() + begin_, size());
    end_ -= begin_;
    begin_ = 0;
  }
  void clear() { begin_ = end_ = 0; }

 private:
  std::unique_ptr<uint8_t[]> bytes_;  // allocated on first use
  size_t begin_ = 0;
  size_t end_ = 0;
};

bool wouldBlock(int errnum) { return errnum == EAGAIN || errnum == EWOULDBLOCK || errnum == EINTR; }

// Why an SSL call failed with `sslError`: OpenSSL's queued error, else the
// system's (errno, as the failed call left it).
std::string reasonOf(int sslError) {
  if (std::string queued = openSslError(); !queued.empty()) return queued;
  if (sslError == SSL_ERROR_SYSCALL) return errno ? std::strerror(errno) : "the connection closed";
  return format("TLS error %d", sslError);
}

struct Link {
  int tcp = -1;
  int local = -1;  // the tunnel's end of the pair
  SSL* ssl = nullptr;
  std::shared_ptr<const TlsKey> key;  // outlives ssl, whose context it holds
  std::shared_ptr<TunnelEnd> end;
  std::string peer;
  bool server = false;
  bool shook = false;  // handshake done
  // Local end -> TCP.
  Buffer out;
  Buffer wire;             // records SSL wrote, for the TCP socket
  BIO* records = nullptr;  // where SSL writes them (SSL owns it)
  bool localDone = false;  // the local end writes nothing more (EOF read)
  bool tcpShut = false;    // TCP's writing side shut after the last record
  // TCP -> local end.
  Buffer in;
  bool tcpDone = false;     // the peer sends nothing more
  bool localShut = false;   // the local end's reading side told so
  bool appGone = false;     // the other end of the pair closed: nothing is read any more
  bool appClosing = false;  // the other end shut its writing side, or closed
  bool finished = false;    // closed, to be freed after this round of events
  bool flushReported = false;
  bool hot = false;  // its pump stopped at kTurnsPerPump with work left
  const Deadline made = Clock::now();

  ~Link() {
    if (ssl) SSL_free(ssl);
    if (tcp >= 0) ::close(tcp);
    if (local >= 0) ::close(local);
  }
  bool outboundDone() const { return localDone && out.empty() && wire.empty() && tcpShut; }
  bool inboundDone() const { return appGone || (tcpDone && in.empty() && localShut); }
};

class Tunnel {
 public:
  static Tunnel& get() {
    static std::mutex making;
    std::lock_guard<std::mutex> lock(making);
    // A child of fork() has no tunnel thread: it starts its own, and leaves
    // the parent's links (their descriptors are the parent's business).
    Tunnel*& one = instance();
    if (!one || one->owner_ != ::getpid()) one = new Tunnel;  // lives until exit
    return *one;
  }

  void add(std::unique_ptr<Link> link) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) {  // the process is exiting: the caller reads the end of the stream
        link->end->markFlushed();
        return;
      }
      arriving_.push_back(std::move(link));
    }
    wake();
  }

 private:
  Tunnel() : owner_(::getpid()) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epoll_ < 0 || wake_ < 0)
      throw Error(ErrorCode::SystemError,
                  format("braid: the TLS tunnel: %s", std::strerror(errno)));
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = 0;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &event);
    OPENSSL_init_ssl(0, nullptr);
    // Registered after OpenSSL's own exit handler, so run before it: the
    // thread sends what links still hold, then stops, while OpenSSL stands.
    std::atexit(stopAtExit);
    thread_ = std::thread([this] { run(); });
  }

  static Tunnel*& instance() {
    static Tunnel* one = nullptr;
    return one;
  }

  static void stopAtExit() {
    Tunnel* tunnel = instance();
    if (!tunnel || tunnel->owner_ != ::getpid() || !tunnel->thread_.joinable()) return;
    tunnel->stopping_ = true;
    tunnel->wake();
    tunnel->thread_.join();
  }

  // Epoll names the link of an event; the local end's events carry the
  // link's address with its lowest bit set.
  static uint64_t tag(Link* link, bool local) {
    return reinterpret_cast<uintptr_t>(link) | (local ? 1u : 0u);
  }
  static Link* linkOf(uint64_t tagged) { return reinterpret_cast<Link*>(tagged & ~uint64_t{1}); }

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }

  void run() {
    // A write to a reset socket raises SIGPIPE in the writing thread; here
    // it stays pending, and the write fails with EPIPE instead.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    constexpr auto kDrainWithin = std::chrono::seconds(1);
    Deadline drainUntil{};
    std::vector<epoll_event> events(64);
    for (;;) {
      if (stopping_ && drainUntil == Deadline{}) drainUntil = Clock::now() + kDrainWithin;
      if (stopping_ && (Clock::now() >= drainUntil || allSent())) return stop();
      bool hot = false, handshaking = false;
      for (const auto& link : links_) {
        hot |= link->hot;
        handshaking |= !link->shook;
      }
      const int wait = hot ? 0 : stopping_ ? 10 : handshaking ? 1000 : -1;
      const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), wait);
      for (auto& link : links_)  // the links cut short last turn go first
        if (link->hot && !link->finished) pump(*link);
      for (int i = 0; i < n; ++i) {
        const epoll_event& event = events[static_cast<size_t>(i)];
        Link* link = linkOf(event.data.u64);
        if (!link) {
          takeArrivals();
        } else if (!link->finished) {
          // The other end of the pair closed: nothing it would read matters
          // (what it wrote before is still read, up to the end of stream).
          if (event.data.u64 & 1) {
            if (event.events & EPOLLHUP) link->appGone = true;
            if (event.events & (EPOLLHUP | EPOLLRDHUP)) link->appClosing = true;
          }
          pump(*link);
        }
      }
      if (stopping_)
        for (auto& link : links_) pump(*link);
      const Deadline now = Clock::now();
      for (auto& link : links_)
        if (link->appGone && !link->shook && now - link->made > kAbandonedHandshake)
          link->finished = true;
      reap();
    }
  }

  // The thread ends: closing a socket no longer waits for it, and a link
  // made from now on is closed at once.
  void stop() {
    for (auto& link : links_) link->finished = true;
    reap();
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    for (auto& link : arriving_) link->end->markFlushed();
    arriving_.clear();
  }

  bool allSent() const {
    for (const auto& link : links_)
      if (!link->finished && (!link->out.empty() || !link->wire.empty())) return false;
    return true;
  }

  void takeArrivals() {
    uint64_t count = 0;
    (void)!::read(wake_, &count, sizeof(count));
    std::vector<std::unique_ptr<Link>> arrived;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      arrived.swap(arriving_);
    }
    for (auto& link : arrived) {
      epoll_event tcp{EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, {}};
      epoll_event local = tcp;
      tcp.data.u64 = tag(link.get(), false);
      local.data.u64 = tag(link.get(), true);
      if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, link->tcp, &tcp) != 0 ||
          ::epoll_ctl(epoll_, EPOLL_CTL_ADD, link->local, &local) != 0) {
        BRAID_WARN(Net, "TLS tunnel to %s: epoll: %s", link->peer.c_str(), std::strerror(errno));
        ::epoll_ctl(epoll_, EPOLL_CTL_DEL, link->tcp, nullptr);
        link->end->markFlushed();
        continue;  // closing both ends tells the caller
      }
      links_.push_back(std::move(link));
      pump(*links_.back());
    }
  }

  void reap() {
    for (auto& link : links_)
      if (link->finished) {
        ::epoll_ctl(epoll_, EPOLL_CTL_DEL, link->tcp, nullptr);
        ::epoll_ctl(epoll_, EPOLL_CTL_DEL, link->local, nullptr);
        link->end->markFlushed();
        link.reset();
      }
    links_.erase(std::remove(links_.begin(), links_.end(), nullptr), links_.end());
  }

  // Ends the link at once: the local end closes, so the caller reads the
  // end of the stream (or EPIPE) as it would from a reset connection.
  static void fail(Link& link, const std::string& why) {
    BRAID_WARN(Net, "TLS with %s: %s; closing the connection", link.peer.c_str(), why.c_str());
    link.finished = true;
  }

  static void pump(Link& link) {
    link.hot = false;
    int turns = 0;
    for (bool moved = true; moved && !link.finished;) {
      if (++turns > kTurnsPerPump) {
        link.hot = true;  // more to do: the run loop comes back without waiting
        return;
      }
      moved = false;
      if (!link.shook && !handshake(link, &moved)) return;
      moved |= readLocal(link);
      if (link.shook) moved |= writeTcp(link);
      if (link.finished) return;
      if (link.shook) moved |= readTcp(link);
      if (link.finished) return;
      moved |= writeLocal(link);
    }
    // Nothing moves any more: once the caller is closing, what could be
    // handed to the TCP socket was (Socket::close() waits for this).
    if ((link.localDone || link.appClosing) && !link.flushReported) {
      link.flushReported = true;
      link.end->markFlushed();
    }
    if (link.outboundDone() && link.inboundDone()) link.finished = true;
  }

  // False once the handshake failed (the link is finished).
  static bool handshake(Link& link, bool* moved) {
    ERR_clear_error();
    const int result = SSL_do_handshake(link.ssl);
    const int sysError = errno;
    const int error = result == 1 ? SSL_ERROR_NONE : SSL_get_error(link.ssl, result);
    if (!sendRecords(link)) return false;
    errno = sysError;
    if (result == 1) {
      link.shook = true;
      *moved = true;
      BRAID_INFO(Net, "TLS with %s: %s, handshake done as the %s", link.peer.c_str(),
                 SSL_get_cipher_name(link.ssl), link.server ? "server" : "client");
      return true;
    }
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return true;
    if (error == SSL_ERROR_SYSCALL) {
      fail(link, format("the connection failed during the handshake: %s", reasonOf(error).c_str()));
      return false;
    }
    fail(link, format("the handshake failed (%s): every rank must hold the same secret "
                      "(ncclSetEncryption, BRAID_SOCKET_KEY_FILE)",
                      reasonOf(error).c_str()));
    return false;
  }

  static bool readLocal(Link& link) {
    if (link.localDone) return false;
    link.out.compact();
    if (link.out.room() == 0) return false;
    const ssize_t n = ::recv(link.local, link.out.tail(), link.out.room(), MSG_DONTWAIT);
    if (n > 0) {
      link.out.added(static_cast<size_t>(n));
      return true;
    }
    if (n < 0 && wouldBlock(errno)) return false;
    link.localDone = true;  // EOF, or the pair broke: nothing more to send
    return true;
  }

  // Moves what SSL wrote into `wire` and sends as much of `wire` as the
  // TCP socket takes. False once the link ended (the peer is gone).
  static bool sendRecords(Link& link) {
    for (;;) {
      link.wire.compact();
      if (link.wire.room() == 0) break;
      const int n = BIO_read(link.records, link.wire.tail(), static_cast<int>(link.wire.room()));
      if (n <= 0) break;
      link.wire.added(static_cast<size_t>(n));
    }
    while (!link.wire.empty()) {
      const ssize_t n =
          ::send(link.tcp, link.wire.head(), link.wire.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        link.wire.taken(static_cast<size_t>(n));
      } else if (n < 0 && wouldBlock(errno)) {
        return true;
      } else {
        // The peer is gone: as with a reset connection, the caller finds
        // the stream ended; what it wrote is lost either way.
        link.finished = true;
        return false;
      }
    }
    return true;
  }

  static bool writeTcp(Link& link) {
    bool moved = false;
    // Encrypt while the records already made would mostly fit the socket.
    while (!link.out.empty() && link.wire.size() + BIO_ctrl_pending(link.records) < kBufferBytes) {
      const size_t chunk = std::min(link.out.size(), kEncryptBytes);
      size_t written = 0;
      ERR_clear_error();
      if (SSL_write_ex(link.ssl, link.out.head(), chunk, &written) != 1) {
        fail(link, format("encrypting failed: %s", reasonOf(SSL_get_error(link.ssl, 0)).c_str()));
        return true;
      }
      link.out.taken(written);
      moved = true;
      if (!sendRecords(link)) return true;
    }
    const size_t before = link.wire.size();
    if (!sendRecords(link)) return true;
    moved |= link.wire.size() != before;
    if (link.localDone && link.out.empty() && link.wire.empty() && !link.tcpShut) {
      ::shutdown(link.tcp, SHUT_WR);
      link.tcpShut = true;
      moved = true;
    }
    return moved;
  }

  static bool readTcp(Link& link) {
    bool moved = false;
    while (!link.tcpDone) {
      link.in.compact();
      if (link.in.room() == 0) return moved;
      size_t got = 0;
      ERR_clear_error();
      if (SSL_read_ex(link.ssl, link.in.tail(), link.in.room(), &got) == 1) {
        link.in.added(got);
        if (link.appGone) link.in.clear();  // nobody reads it
        moved = true;
        continue;
      }
      const int sysError = errno;
      const int error = SSL_get_error(link.ssl, 0);
      errno = sysError;
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE)
        return sendRecords(link) ? moved : true;
      if (error == SSL_ERROR_ZERO_RETURN ||
          (error == SSL_ERROR_SYSCALL && (errno == 0 || errno == ECONNRESET || errno == EPIPE))) {
        link.tcpDone = true;  // closed or reset: the caller reads the end of the stream
        return true;
      }
      if (error == SSL_ERROR_SYSCALL)
        fail(link, format("receiving failed: %s", reasonOf(error).c_str()));
      else
        fail(link, format("a record did not authenticate or parse (%s): the connection was "
                          "tampered with, or the peer holds another secret",
                          reasonOf(error).c_str()));
      return true;
    }
    return moved;
  }

  static bool writeLocal(Link& link) {
    bool moved = false;
    while (!link.in.empty() && !link.appGone) {
      const ssize_t n =
          ::send(link.local, link.in.head(), link.in.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        link.in.taken(static_cast<size_t>(n));
        moved = true;
      } else if (n < 0 && wouldBlock(errno)) {
        return moved;
      } else {
        link.appGone = true;  // the caller closed its end
        link.in.clear();
        moved = true;
      }
    }
    if (link.appGone) link.in.clear();
    if (link.tcpDone && link.in.empty() && !link.localShut && !link.appGone) {
      ::shutdown(link.local, SHUT_WR);
      link.localShut = true;
      moved = true;
    }
    return moved;
  }

  const pid_t owner_;
  int epoll_ = -1;
  int wake_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;      // guards arriving_ and stopped_
  bool stopped_ = false;  // the thread has ended
  std::vector<std::unique_ptr<Link>> arriving_;
  std::vector<std::unique_ptr<Link>> links_;  // the thread's own
};

}  // namespace

Socket tunnel(Socket tcp, TlsRole role, std::shared_ptr<const TlsKey> key, const Address& peer) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
    throw Error(ErrorCode::SystemError, format("braid: socketpair for the TLS tunnel to %s: %s",
                                               peer.toString().c_str(), std::strerror(errno)));
  Socket local(pair[0]);
  auto link = std::make_unique<Link>();
  link->local = pair[1];
  link->peer = peer.toString();
  link->server = role == TlsRole::Server;
  link->end = std::make_shared<TunnelEnd>();
  link->ssl = SSL_new(static_cast<SSL_CTX*>(key->context()));
  link->key = std::move(key);
  if (!link->ssl)
    throw Error(ErrorCode::SystemError, format("braid: TLS with %s: %s", link->peer.c_str(),
                                               reasonOf(SSL_ERROR_SSL).c_str()));
  tcp.setNonBlocking(true);
  // Records are read from the socket, many per call, and written to memory.
  BIO* socketSide = BIO_new_socket(tcp.fd(), BIO_NOCLOSE);
  link->records = BIO_new(BIO_s_mem());
  if (!socketSide || !link->records) {
    BIO_free(socketSide);
    BIO_free(link->records);
    throw Error(ErrorCode::SystemError,
                format("braid: TLS with %s: out of memory", link->peer.c_str()));
  }
  SSL_set_bio(link->ssl, socketSide, link->records);
  SSL_set_read_ahead(link->ssl, 1);
  SSL_set_default_read_buffer_len(link->ssl, kReadAheadBytes);
  if (link->server)
    SSL_set_accept_state(link->ssl);
  else
    SSL_set_connect_state(link->ssl);
  link->tcp = tcp.release();
  local.attachTunnel(link->end, peer);
  Tunnel::get().add(std::move(link));
  return local;
}

#else  // no TLS in this build: TlsKey::fromSecret() refuses every key

Socket tunnel(Socket, TlsRole, std::shared_ptr<const TlsKey>, const Address& peer) {
  throw Error(
      ErrorCode::InvalidUsage,
      format("braid: no TLS in this build for the connection to %s", peer.toString().c_str()));
}

#endif

}  // namespace braid::net
