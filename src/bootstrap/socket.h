// Thin, deadline-aware TCP socket helpers shared by the bootstrap and the TCP
// transport. IPv4 and IPv6. Nothing here knows about ranks or collectives.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace braid::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Milliseconds from now until `deadline`, for poll(): rounded up, 0 once it has
// passed, at most INT_MAX.
int millisecondsUntil(Deadline deadline);

// An IPv4 or IPv6 address with a port.
class Address {
 public:
  Address() = default;
  // "127.0.0.1:29500", "[::1]:29500", "host.example:29500" (resolved).
  // Throws Error(InvalidArgument) naming `what` when it does not parse.
  static Address parse(const std::string& text, const char* what);
  static Address fromSockaddr(const sockaddr* sa, socklen_t len);
  static Address loopback(uint16_t port = 0);  // 127.0.0.1

  std::string toString() const;  // "127.0.0.1:29500" or "[::1]:29500"
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  int family() const { return storage_.ss_family; }
  const sockaddr* sockaddr_() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const { return length_; }

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

// The address of interface `ifname` (IPv4 preferred), port 0. Throws
// Error(InvalidArgument) naming BRAID_SOCKET_IFNAME if it has none.
Address interfaceAddress(const std::string& ifname);
// The local address the kernel would use to reach `remote`, port 0.
Address routeTo(const Address& remote);
// An address for a rendezvous root with no other hint: the first interface
// that is up and not loopback, else 127.0.0.1.
Address defaultLocalAddress();

class TunnelEnd;  // tls_tunnel.cc

// An owned, connected stream socket (close on destruction). Blocking calls
// take a deadline and throw Error(Timeout) past it, Error(RemoteError) when the
// peer closed or reset the connection; `who` names the peer in messages.
// Messages from this layer read "braid: <detail>"; a caller that knows its
// rank may replace that prefix with "braid rank R: ".
//
// connect() and Listener::accept() hand each TCP connection to the TLS
// tunnel when sockets are encrypted (tls.h): the Socket is then the local
// end that stands for it, and reads and writes as the TCP socket would.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept { *this = std::move(other); }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  static Socket connect(const Address& to, Deadline deadline, const std::string& who);
  // One attempt, no retry: a connected socket, or an invalid one with the
  // reason in *errnum (ECONNREFUSED: nobody listens there any more).
  static Socket connectOnce(const Address& to, Deadline deadline, int* errnum);

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up the descriptor (a plaintext socket's: a tunnelled one's is
  // closed through close(), which sends what it holds first).
  int release();
  // Closes; a tunnelled socket first waits (at most a second) until what
  // was written to it has left on the TCP connection.
  void close();

  void sendAll(const void* data, size_t bytes, Deadline deadline, const std::string& who);
  void recvAll(void* data, size_t bytes, Deadline deadline, const std::string& who);
  void setNonBlocking(bool on);
  void setNoDelay();
  Address localAddress() const;
  // The far end: for a tunnelled socket, that of its TCP connection.
  Address peerAddress() const;

  // Marks this socket as the local end of a TLS tunnel (tls_tunnel.cc).
  void attachTunnel(std::shared_ptr<TunnelEnd> end, const Address& peer);
  // Whether this is a TLS tunnel's local end.
  bool encrypted() const { return tunnel_ != nullptr; }

 private:
  int fd_ = -1;
  std::shared_ptr<TunnelEnd> tunnel_;  // set when this is a tunnel's local end
  Address peer_;                       // the tunnel's TCP peer
};

// A listening socket.
class Listener {
 public:
  Listener() = default;
  // Binds `at` (port 0 picks a free one) and listens with a large backlog.
  explicit Listener(const Address& at);
  Listener(Listener&&) noexcept = default;
  Listener& operator=(Listener&&) noexcept = default;

  const Address& address() const { return address_; }  // with the bound port
  int fd() const { return socket_.fd(); }
  // Waits for one connection until the deadline; an invalid Socket on timeout.
  Socket accept(Deadline deadline);

 private:
  Socket socket_;
  Address address_;
};

}  // namespace braid::net
