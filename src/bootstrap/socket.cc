#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "bootstrap/tls.h"
#include "braid/error.h"
#include "core/errors.h"

namespace braid::net {
namespace {

using namespace std::chrono_literals;

// Errors from this layer read "braid: <detail>"; a caller that knows its rank
// replaces the prefix with "braid rank R: ".
[[noreturn]] void raise(ErrorCode code, const std::string& detail) {
  throw Error(code, "braid: " + detail);
}

[[noreturn]] void raiseSystem(const std::string& what, int errnum) {
  raise(ErrorCode::SystemError, what + ": " + std::strerror(errnum));
}

bool isPeerGone(int errnum) {
  return errnum == ECONNRESET || errnum == EPIPE || errnum == ENOTCONN;
}

// Errors after which a connect attempt is worth repeating: nobody listens yet,
// or the network is not up yet.
bool isRetryableConnectError(int errnum) {
  return errnum == ECONNREFUSED || errnum == ECONNRESET || errnum == ETIMEDOUT ||
         errnum == EHOSTUNREACH || errnum == ENETUNREACH || errnum == EAGAIN || errnum == EINTR;
}

// Waits until `fd` is ready for `events` (or has an error to report); false
// when the deadline passes first.
bool waitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    int ready = ::poll(&entry, 1, millisecondsUntil(deadline));
    if (ready > 0) return true;
    if (ready == 0 && Clock::now() >= deadline) return false;
    if (ready < 0 && errno != EINTR) raiseSystem("poll", errno);
  }
}

// One non-blocking connect attempt: a connected socket, or an invalid one with
// the reason in *errnum.
Socket tryConnect(const Address& to, Deadline deadline, int* errnum) {
  int fd = ::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) raiseSystem("socket", errno);
  Socket socket(fd);
  if (::connect(fd, to.sockaddr_(), to.length()) != 0) {
    if (errno != EINPROGRESS) {
      *errnum = errno;
      return Socket();
    }
    if (!waitFor(fd, POLLOUT, deadline)) {
      *errnum = ETIMEDOUT;
      return Socket();
    }
    socklen_t length = sizeof(*errnum);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, errnum, &length) != 0) *errnum = errno;
    if (*errnum != 0) return Socket();
  }
  socket.setNonBlocking(false);
  return socket;
}

// The connection as braid's sockets carry it: itself, or the local end of
// its TLS tunnel when sockets are encrypted.
Socket secure(Socket tcp, TlsRole role, const Address& peer) {
  std::shared_ptr<const TlsKey> key = socketKey();
  if (!key) return tcp;
  return tunnel(std::move(tcp), role, std::move(key), peer);
}

// Calls fn(ifaddrs&) for every interface address that has one.
template <typename Fn>
void forEachInterfaceAddress(Fn fn) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) raiseSystem("getifaddrs", errno);
  for (ifaddrs* entry = list; entry; entry = entry->ifa_next)
    if (entry->ifa_addr) fn(*entry);
  ::freeifaddrs(list);
}

bool isLinkLocalV6(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
}

socklen_t sockaddrLength(int family) {
  return family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

// Picks addresses for interfaceAddress() and defaultLocalAddress(): the first
// IPv4 address, else the first global IPv6 one, else a link-local IPv6 one.
class AddressPicker {
 public:
  void offer(const sockaddr* sa) {
    int preference = sa->sa_family == AF_INET ? 0 : sa->sa_family == AF_INET6 ? 1 : -1;
    if (preference == 1 && isLinkLocalV6(sa)) preference = 2;
    if (preference < 0 || preference >= best_) return;
    best_ = preference;
    picked_ = Address::fromSockaddr(sa, sockaddrLength(sa->sa_family));
    picked_.setPort(0);
  }
  bool found() const { return best_ < kNone; }
  const Address& picked() const { return picked_; }

 private:
  static constexpr int kNone = 3;
  int best_ = kNone;
  Address picked_;
};

bool isVirtualInterface(const char* name) {
  for (const char* prefix : {"docker", "veth", "virbr"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

// "29500" -> 29500; false for anything that is not a number in [0, 65535].
bool parsePort(const std::string& text, uint16_t* port) {
  if (text.empty() || text.size() > 5) return false;
  unsigned value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return false;
  *port = static_cast<uint16_t>(value);
  return true;
}

}  // namespace

int millisecondsUntil(Deadline deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<decltype(ms)>(ms, INT_MAX));
}

// --- Address ---------------------------------------------------------------

Address Address::parse(const std::string& text, const char* what) {
  auto reject = [&](const char* why) {
    raise(ErrorCode::InvalidArgument,
          format("%s '%s' is not an address (%s); expected host:port, e.g. 127.0.0.1:29500 or "
                 "[::1]:29500",
                 what, text.c_str(), why));
  };
  std::string host, portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      reject("an IPv6 address is written [address]:port");
    host = text.substr(1, close - 1);
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) reject("no port");
    host = text.substr(0, colon);
    portText = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) reject("an IPv6 address needs brackets");
  }
  if (host.empty()) reject("no host");
  uint16_t port = 0;
  if (!parsePort(portText, &port)) reject("the port is not a number from 0 to 65535");

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &results); rc != 0)
    reject(::gai_strerror(rc));
  const addrinfo* chosen = results;  // IPv4 when the name has both
  for (const addrinfo* r = results; r; r = r->ai_next)
    if (r->ai_family == AF_INET) {
      chosen = r;
      break;
    }
  Address address = fromSockaddr(chosen->ai_addr, chosen->ai_addrlen);
  ::freeaddrinfo(results);
  address.setPort(port);
  return address;
}

Address Address::fromSockaddr(const sockaddr* sa, socklen_t len) {
  Address address;
  address.length_ = std::min<socklen_t>(len, sizeof(address.storage_));
  std::memcpy(&address.storage_, sa, address.length_);
  return address;
}

Address Address::loopback(uint16_t port) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in.sin_port = htons(port);
  return fromSockaddr(reinterpret_cast<const sockaddr*>(&in), sizeof(in));
}

std::string Address::toString() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&storage_);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return format("%s:%u", text, port());
  }
  if (family() == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage_);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    std::string scope;
    char name[IF_NAMESIZE] = {};
    if (in6->sin6_scope_id != 0 && ::if_indextoname(in6->sin6_scope_id, name))
      scope = std::string("%") + name;
    return format("[%s%s]:%u", text, scope.c_str(), port());
  }
  return "(no address)";
}

uint16_t Address::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

void Address::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

bool Address::isLoopback() const {
  if (family() == AF_INET) {
    uint32_t host = ntohl(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr.s_addr);
    return (host >> 24) == 127;
  }
  if (family() == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  return false;
}

// --- interfaces --------------------------------------------------------------

Address interfaceAddress(const std::string& ifname) {
  AddressPicker picker;
  forEachInterfaceAddress([&](const ifaddrs& entry) {
    if (ifname == entry.ifa_name) picker.offer(entry.ifa_addr);
  });
  if (!picker.found())
    raise(ErrorCode::InvalidArgument,
          format("BRAID_SOCKET_IFNAME=%s: no interface of that name has an IPv4 or IPv6 address",
                 ifname.c_str()));
  return picker.picked();
}

Address routeTo(const Address& remote) {
  int fd = ::socket(remote.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) raiseSystem("socket", errno);
  Socket probe(fd);
  Address target = remote;
  if (target.port() == 0) target.setPort(9);  // UDP connect wants a port; nothing is sent
  if (::connect(fd, target.sockaddr_(), target.length()) != 0)
    raiseSystem("no route to " + remote.toString(), errno);
  Address local = probe.localAddress();
  local.setPort(0);
  return local;
}

Address defaultLocalAddress() {
  AddressPicker picker;
  forEachInterfaceAddress([&](const ifaddrs& entry) {
    bool up = entry.ifa_flags & IFF_UP;
    bool loopback = entry.ifa_flags & IFF_LOOPBACK;
    if (up && !loopback && !isVirtualInterface(entry.ifa_name)) picker.offer(entry.ifa_addr);
  });
  return picker.found() ? picker.picked() : Address::loopback();
}

// --- Socket ----------------------------------------------------------------

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
    tunnel_ = std::move(other.tunnel_);
    peer_ = other.peer_;
  }
  return *this;
}

Socket::~Socket() { close(); }

int Socket::release() {
  int fd = fd_;
  fd_ = -1;
  tunnel_.reset();
  return fd;
}

void Socket::close() {
  if (fd_ >= 0 && tunnel_) closeTunnelled(fd_, *tunnel_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  tunnel_.reset();
}

void Socket::attachTunnel(std::shared_ptr<TunnelEnd> end, const Address& peer) {
  tunnel_ = std::move(end);
  peer_ = peer;
}

Socket Socket::connect(const Address& to, Deadline deadline, const std::string& who) {
  auto backoff = 10ms;
  for (;;) {
    int errnum = 0;
    Socket socket = tryConnect(to, deadline, &errnum);
    if (socket.valid()) {
      socket.setNoDelay();
      return secure(std::move(socket), TlsRole::Client, to);
    }
    if (!isRetryableConnectError(errnum)) raiseSystem(format("connect to %s", who.c_str()), errnum);
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero())
      raise(ErrorCode::Timeout, format("timed out connecting to %s (last attempt: %s)", who.c_str(),
                                       std::strerror(errnum)));
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, left));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

Socket Socket::connectOnce(const Address& to, Deadline deadline, int* errnum) {
  *errnum = 0;
  Socket socket = tryConnect(to, deadline, errnum);
  if (!socket.valid()) return socket;
  socket.setNoDelay();
  return secure(std::move(socket), TlsRole::Client, to);
}

void Socket::sendAll(const void* data, size_t bytes, Deadline deadline, const std::string& who) {
  auto* next = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t sent = ::send(fd_, next, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      next += sent;
      bytes -= static_cast<size_t>(sent);
      continue;
    }
    int errnum = errno;
    if (errnum == EINTR) continue;
    if (errnum == EAGAIN || errnum == EWOULDBLOCK) {
      if (!waitFor(fd_, POLLOUT, deadline))
        raise(ErrorCode::Timeout,
              format("timed out waiting for %s to take %zu more bytes", who.c_str(), bytes));
      continue;
    }
    if (isPeerGone(errnum)) raise(ErrorCode::RemoteError, who + " closed the connection");
    raiseSystem("sending to " + who, errnum);
  }
}

void Socket::recvAll(void* data, size_t bytes, Deadline deadline, const std::string& who) {
  auto* next = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t got = ::recv(fd_, next, bytes, MSG_DONTWAIT);
    if (got > 0) {
      next += got;
      bytes -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) raise(ErrorCode::RemoteError, who + " closed the connection");
    int errnum = errno;
    if (errnum == EINTR) continue;
    if (errnum == EAGAIN || errnum == EWOULDBLOCK) {
      if (!waitFor(fd_, POLLIN, deadline))
        raise(ErrorCode::Timeout,
              format("timed out waiting for %s (%zu bytes still to come)", who.c_str(), bytes));
      continue;
    }
    if (isPeerGone(errnum)) raise(ErrorCode::RemoteError, who + " closed the connection");
    raiseSystem("receiving from " + who, errnum);
  }
}

void Socket::setNonBlocking(bool on) {
  int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0) raiseSystem("fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd_, F_SETFL, flags) != 0) raiseSystem("fcntl(F_SETFL)", errno);
}

void Socket::setNoDelay() {
  // Best effort: only TCP sockets have the option, and latency is all it buys.
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Address Socket::localAddress() const {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&storage), &length) != 0)
    raiseSystem("getsockname", errno);
  return Address::fromSockaddr(reinterpret_cast<const sockaddr*>(&storage), length);
}

Address Socket::peerAddress() const {
  if (tunnel_) return peer_;
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&storage), &length) != 0)
    raiseSystem("getpeername", errno);
  return Address::fromSockaddr(reinterpret_cast<const sockaddr*>(&storage), length);
}

// --- Listener ----------------------------------------------------------------

Listener::Listener(const Address& at) {
  // Non-blocking, so that accept() never blocks on a connection that went away
  // between poll() and accept().
  int fd = ::socket(at.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) raiseSystem("socket to listen on " + at.toString(), errno);
  socket_ = Socket(fd);
  int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
    raiseSystem("setsockopt(SO_REUSEADDR)", errno);
  if (::bind(fd, at.sockaddr_(), at.length()) != 0) raiseSystem("bind " + at.toString(), errno);
  if (::listen(fd, SOMAXCONN) != 0) raiseSystem("listen on " + at.toString(), errno);
  address_ = socket_.localAddress();
}

Socket Listener::accept(Deadline deadline) {
  for (;;) {
    int fd = ::accept4(socket_.fd(), nullptr, nullptr, SOCK_CLOEXEC);  // blocking socket
    if (fd >= 0) {
      Socket socket(fd);
      socket.setNoDelay();
      Address peer;
      try {
        peer = socket.peerAddress();
      } catch (const Error&) {
        continue;  // reset before we took it
      }
      return secure(std::move(socket), TlsRole::Server, peer);
    }
    int errnum = errno;
    if (errnum == EAGAIN || errnum == EWOULDBLOCK) {
      if (!waitFor(socket_.fd(), POLLIN, deadline)) return Socket();
      continue;
    }
    // The connection failed before we took it; wait for the next one.
    if (errnum == EINTR || errnum == ECONNABORTED || errnum == EPROTO) continue;
    raiseSystem("accept on " + address_.toString(), errnum);
  }
}

}  // namespace braid::net
