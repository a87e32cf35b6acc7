// UniqueId encoding, the host identity, and everything a rank does after the
// rendezvous: the OOB ring, allGather/barrier, and connections between ranks.
// The rendezvous itself (root and registration) is in root.cc.
#include "bootstrap/bootstrap.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>

#include "bootstrap/wire.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::bootstrap {
namespace {

using namespace std::chrono_literals;
using net::Clock;

// UniqueId layout, integers little-endian:
//   [0, 4) magic "BRD1"   [4, 6) version   [6, 8) family (4 or 6)   [8, 10) root port
//   [10, 26) root address, network order (IPv4 in the first 4 bytes)
//   [26, 34) job secret   [34, 128) zero
constexpr char kIdMagic[4] = {'B', 'R', 'D', '1'};
constexpr uint16_t kIdVersion = 1;
constexpr size_t kIdVersionAt = 4;
constexpr size_t kIdFamilyAt = 6;
constexpr size_t kIdPortAt = 8;
constexpr size_t kIdAddressAt = 10;
constexpr size_t kIdSecretAt = 26;
using wire::kFamilyV4;  // the address families as the frames number them
using wire::kFamilyV6;

// Frames between ranks: a 16-byte header {u32 magic "BRDP", u32 type, u64
// payload length}, little-endian, then the payload.
//   Hello {u64 secret, u32 rank, u32 purpose}  opens every connection between ranks
//   Block {bytesPerRank bytes}                 one allGather step on the OOB ring
constexpr uint32_t kFrameMagic = 0x50445242;  // "BRDP"
constexpr uint32_t kHelloType = 1;
constexpr uint32_t kBlockType = 2;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kHelloPayloadBytes = 16;
constexpr size_t kHelloBytes = kHeaderBytes + kHelloPayloadBytes;
// An accepted connection whose hello is not complete by then is dropped.
constexpr auto kHelloWithin = 2s;

void put(uint8_t* at, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) at[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t get(const uint8_t* at, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(at[i]) << (8 * i);
  return value;
}

using Header = std::array<uint8_t, kHeaderBytes>;

Header encodeHeader(uint32_t type, uint64_t length) {
  Header header{};
  put(header.data(), kFrameMagic, 4);
  put(header.data() + 4, type, 4);
  put(header.data() + 8, length, 8);
  return header;
}

bool isHeader(const uint8_t* bytes, uint32_t type) {
  return get(bytes, 4) == kFrameMagic && get(bytes + 4, 4) == type;
}

std::array<uint8_t, kHelloBytes> encodeHello(uint64_t secret, int rank, uint32_t purpose) {
  std::array<uint8_t, kHelloBytes> hello{};
  Header header = encodeHeader(kHelloType, kHelloPayloadBytes);
  std::copy(header.begin(), header.end(), hello.begin());
  put(hello.data() + kHeaderBytes, secret, 8);
  put(hello.data() + kHeaderBytes + 8, static_cast<uint32_t>(rank), 4);
  put(hello.data() + kHeaderBytes + 12, purpose, 4);
  return hello;
}

// Checks a complete hello: "" and *key = (rank, purpose) when it comes from a
// rank of this job, else why not.
std::string checkHello(const uint8_t* hello, uint64_t secret, int nranks,
                       std::pair<int, uint32_t>* key) {
  if (get(hello, 4) != kFrameMagic) return "not a braid connection (bad magic)";
  if (!isHeader(hello, kHelloType) || get(hello + 8, 8) != kHelloPayloadBytes)
    return "malformed hello";
  const uint8_t* payload = hello + kHeaderBytes;
  if (get(payload, 8) != secret) return "wrong job secret";
  uint64_t rank = get(payload + 8, 4);
  if (rank >= static_cast<uint64_t>(nranks))
    return format("hello from rank %llu, but the job has %d ranks",
                  static_cast<unsigned long long>(rank), nranks);
  *key = {static_cast<int>(rank), static_cast<uint32_t>(get(payload + 12, 4))};
  return "";
}

// Runs fn() and rethrows errors of the socket layer ("braid: ...") as errors
// of `rank` ("braid rank R: ...").
template <typename Fn>
auto asRank(int rank, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    constexpr std::string_view kPrefix = "braid: ";
    std::string_view message = e.what();
    if (message.substr(0, kPrefix.size()) != kPrefix) throw;
    fail(e.code(), rank, std::string(message.substr(kPrefix.size())));
  }
}

bool isWildcard(const net::Address& address) {
  if (address.family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(address.sockaddr_())->sin_addr.s_addr ==
           htonl(INADDR_ANY);
  if (address.family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(
        &reinterpret_cast<const sockaddr_in6*>(address.sockaddr_())->sin6_addr);
  return false;
}

// The address other ranks reach `listener` at: the one it is bound to, or,
// when it listens on every interface, the one that routes to the root.
net::Address advertisedAddress(const net::Listener& listener, const net::Address& root) {
  if (!isWildcard(listener.address())) return listener.address();
  net::Address address = net::routeTo(root);
  address.setPort(listener.address().port());
  return address;
}

// One direction of a ring step: `left` bytes at `data` to send to, or receive
// from, rank `peer` over `fd`.
struct Flow {
  int fd;
  uint8_t* data;
  size_t left;
  int peer;
};

// Sends or receives what `flow` can take now, without blocking.
void advance(int rank, Flow& flow, bool sending, const std::string& op) {
  ssize_t moved = sending ? ::send(flow.fd, flow.data, flow.left, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : ::recv(flow.fd, flow.data, flow.left, MSG_DONTWAIT);
  if (moved > 0) {
    flow.data += moved;
    flow.left -= static_cast<size_t>(moved);
    return;
  }
  int errnum = moved == 0 ? ECONNRESET : errno;  // recv() returns 0 when the peer closed
  if (errnum == EAGAIN || errnum == EWOULDBLOCK || errnum == EINTR) return;
  if (errnum == ECONNRESET || errnum == EPIPE)
    fail(ErrorCode::RemoteError, rank,
         format("%s: rank %d closed the connection", op.c_str(), flow.peer));
  failSystem(rank, format("%s with rank %d", op.c_str(), flow.peer), errnum);
}

// Moves `out` and `in` forward together, so that ranks sending each other
// large blocks never wait on each other.
void exchange(int rank, Flow out, Flow in, net::Deadline deadline, const std::string& op) {
  while (out.left > 0 || in.left > 0) {
    pollfd fds[2] = {{out.left > 0 ? out.fd : -1, POLLOUT, 0},
                     {in.left > 0 ? in.fd : -1, POLLIN, 0}};
    int ready = ::poll(fds, 2, net::millisecondsUntil(deadline));
    if (ready < 0 && errno != EINTR) failSystem(rank, op + ": poll", errno);
    if (ready == 0 && Clock::now() >= deadline)
      fail(ErrorCode::Timeout, rank,
           format("%s: timed out waiting for rank %d", op.c_str(), in.left ? in.peer : out.peer));
    if (fds[0].revents) advance(rank, out, true, op);
    if (fds[1].revents) advance(rank, in, false, op);
  }
}

}  // namespace

// --- UniqueId ----------------------------------------------------------------

UniqueId encodeId(const IdContents& contents) {
  UniqueId id;
  auto* bytes = reinterpret_cast<uint8_t*>(id.bytes.data());
  const sockaddr* root = contents.root.sockaddr_();
  std::memcpy(bytes, kIdMagic, sizeof(kIdMagic));
  put(bytes + kIdVersionAt, kIdVersion, 2);
  put(bytes + kIdPortAt, contents.root.port(), 2);
  if (contents.root.family() == AF_INET) {
    put(bytes + kIdFamilyAt, kFamilyV4, 2);
    std::memcpy(bytes + kIdAddressAt, &reinterpret_cast<const sockaddr_in*>(root)->sin_addr, 4);
  } else if (contents.root.family() == AF_INET6) {
    put(bytes + kIdFamilyAt, kFamilyV6, 2);
    std::memcpy(bytes + kIdAddressAt, &reinterpret_cast<const sockaddr_in6*>(root)->sin6_addr, 16);
  } else {
    throw Error(ErrorCode::InvalidArgument,
                "braid: UniqueId: the root address must be IPv4 or IPv6");
  }
  put(bytes + kIdSecretAt, contents.secret, 8);
  return id;
}

IdContents decodeId(const UniqueId& id) {
  auto reject = [](const std::string& why) {
    throw Error(ErrorCode::InvalidArgument, "braid: UniqueId " + why);
  };
  const auto* bytes = reinterpret_cast<const uint8_t*>(id.bytes.data());
  if (std::all_of(bytes, bytes + id.bytes.size(), [](uint8_t b) { return b == 0; }))
    reject("is all zero: it was never filled in (make it on one rank, share its bytes with all)");
  if (std::memcmp(bytes, kIdMagic, sizeof(kIdMagic)) != 0)
    reject("has the wrong magic: these bytes are not a braid UniqueId");
  if (uint64_t version = get(bytes + kIdVersionAt, 2); version != kIdVersion)
    reject(format("version %llu is not supported (this braid reads version %u)",
                  static_cast<unsigned long long>(version), kIdVersion));
  const uint64_t family = get(bytes + kIdFamilyAt, 2);
  const auto port = static_cast<uint16_t>(get(bytes + kIdPortAt, 2));
  if (port == 0) reject("names port 0");

  IdContents contents;
  contents.secret = get(bytes + kIdSecretAt, 8);
  if (family == kFamilyV4) {
    sockaddr_in in{};
    in.sin_family = AF_INET;
    std::memcpy(&in.sin_addr, bytes + kIdAddressAt, 4);
    contents.root = net::Address::fromSockaddr(reinterpret_cast<sockaddr*>(&in), sizeof(in));
  } else if (family == kFamilyV6) {
    sockaddr_in6 in6{};
    in6.sin6_family = AF_INET6;
    std::memcpy(&in6.sin6_addr, bytes + kIdAddressAt, 16);
    contents.root = net::Address::fromSockaddr(reinterpret_cast<sockaddr*>(&in6), sizeof(in6));
  } else {
    reject(format("names an unknown address family %llu", static_cast<unsigned long long>(family)));
  }
  contents.root.setPort(port);
  return contents;
}

std::string localHostId() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown-host");
  std::string id = host;
  // The boot id tells apart containers and machines that share a hostname.
  std::ifstream bootIdFile("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (std::getline(bootIdFile, bootId) && !bootId.empty()) id += "/" + bootId;
  // So does the network namespace: processes in different ones (containers,
  // or a test's namespace hosts) share no loopback and no abstract sockets,
  // and are treated as on different hosts.
  struct stat ns {};
  if (::stat("/proc/self/ns/net", &ns) == 0)
    id += "/net:" + std::to_string(static_cast<unsigned long long>(ns.st_ino));
  return id;
}

// --- Bootstrap ---------------------------------------------------------------

struct Bootstrap::Arrival {
  net::Socket socket;
  net::Address from;
  net::Deadline expires;  // dropped when the hello is not complete by then
  std::array<uint8_t, kHelloBytes> hello{};
  size_t have = 0;

  void drop(int rank, const std::string& why) {
    BRAID_WARN(Bootstrap, "rank %d: dropped a connection from %s: %s", rank,
               from.toString().c_str(), why.c_str());
    socket.close();
  }
};

Bootstrap::Bootstrap(net::Listener listener, std::vector<PeerInfo> table, int rank, uint64_t secret)
    : listener_(std::move(listener)), table_(std::move(table)), rank_(rank), secret_(secret) {}

Bootstrap::~Bootstrap() = default;

std::unique_ptr<Bootstrap> Bootstrap::join(const UniqueId& id, int nranks, int rank,
                                           const net::Address& listenAt, net::Deadline deadline) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    fail(ErrorCode::InvalidArgument, rank,
         format("rank %d of %d: the rank must be in [0, nranks)", rank, nranks));
  return asRank(rank, [&] {
    IdContents job = decodeId(id);
    net::Listener listener(listenAt);
    PeerInfo self{advertisedAddress(listener, job.root), localHostId()};
    std::vector<PeerInfo> table = registerWithRoot(job, nranks, rank, self, deadline);
    std::unique_ptr<Bootstrap> bootstrap(
        new Bootstrap(std::move(listener), std::move(table), rank, job.secret));
    bootstrap->connectRing(deadline);
    return bootstrap;
  });
}

std::unique_ptr<Bootstrap> Bootstrap::fromTable(net::Listener listener, std::vector<PeerInfo> table,
                                                int rank, uint64_t secret, net::Deadline deadline) {
  if (rank < 0 || rank >= static_cast<int>(table.size()))
    fail(ErrorCode::InvalidArgument, rank,
         format("fromTable: rank %d is not in a table of %zu ranks", rank, table.size()));
  std::unique_ptr<Bootstrap> bootstrap(
      new Bootstrap(std::move(listener), std::move(table), rank, secret));
  bootstrap->connectRing(deadline);
  return bootstrap;
}

void Bootstrap::connectRing(net::Deadline deadline) {
  const int n = size();
  if (n == 1) return;
  constexpr auto kRing = static_cast<uint32_t>(Purpose::OobRing);
  // Connecting first cannot deadlock: the peer's kernel completes the
  // connection and buffers the hello before anyone accepts. At size 2 both
  // neighbours are one peer, reached over two sockets, one per direction.
  ringNext_ = connectTo((rank_ + 1) % n, kRing, deadline);
  ringPrev_ = acceptFrom((rank_ + n - 1) % n, kRing, deadline);
}

void Bootstrap::checkPeer(int peer, const char* op) const {
  if (peer < 0 || peer >= size())
    fail(ErrorCode::InvalidArgument, rank_,
         format("%s: peer %d is not a rank of this job of %d", op, peer, size()));
}

net::Socket Bootstrap::connectTo(int peer, uint32_t purpose, net::Deadline deadline) {
  checkPeer(peer, "connectTo");
  const net::Address& to = table_[peer].listen;
  const std::string who = format("rank %d at %s", peer, to.toString().c_str());
  return asRank(rank_, [&] {
    net::Socket socket = net::Socket::connect(to, deadline, who);
    auto hello = encodeHello(secret_, rank_, purpose);
    socket.sendAll(hello.data(), hello.size(), deadline, who);
    return socket;
  });
}

net::Socket Bootstrap::acceptFrom(int peer, uint32_t purpose, net::Deadline deadline) {
  checkPeer(peer, "acceptFrom");
  const Key wanted{peer, purpose};
  for (;;) {
    if (auto it = pending_.lower_bound(wanted); it != pending_.end() && it->first == wanted) {
      net::Socket socket = std::move(it->second);
      pending_.erase(it);
      return socket;
    }
    if (Clock::now() >= deadline)
      fail(ErrorCode::Timeout, rank_,
           format("timed out waiting for rank %d to connect (purpose %u)", peer, purpose));
    asRank(rank_, [&] { waitForArrivals(deadline); });
  }
}

net::Socket Bootstrap::tryConnectTo(int peer, uint32_t purpose, net::Deadline deadline,
                                    int* errnum) {
  checkPeer(peer, "tryConnectTo");
  net::Socket socket = net::Socket::connectOnce(table_[peer].listen, deadline, errnum);
  if (!socket.valid()) {
    if (*errnum == 0 || *errnum == EINPROGRESS) *errnum = ETIMEDOUT;
    return socket;
  }
  auto hello = encodeHello(secret_, rank_, purpose);
  try {
    socket.sendAll(hello.data(), hello.size(), deadline, format("rank %d", peer));
  } catch (const Error& error) {
    *errnum = error.code() == ErrorCode::Timeout ? ETIMEDOUT : ECONNRESET;
    return net::Socket();
  }
  return socket;
}

std::pair<int, net::Socket> Bootstrap::acceptAny(uint32_t purpose, net::Deadline until) {
  for (;;) {
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if (it->first.second == purpose) {
        std::pair<int, net::Socket> found{it->first.first, std::move(it->second)};
        pending_.erase(it);
        return found;
      }
    if (Clock::now() >= until) return {-1, net::Socket()};
    asRank(rank_, [&] { waitForArrivals(until); });
  }
}

void Bootstrap::waitForArrivals(net::Deadline deadline) {
  // No thread per connection and no blocking read: a stranger that connects
  // and stays silent costs a slot in this poll set until it expires.
  std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
  net::Deadline wake = deadline;
  for (const Arrival& arrival : arrivals_) {
    fds.push_back({arrival.socket.fd(), POLLIN, 0});
    wake = std::min(wake, arrival.expires);
  }
  if (::poll(fds.data(), fds.size(), net::millisecondsUntil(wake)) < 0 && errno != EINTR)
    failSystem(rank_, "poll", errno);
  for (size_t i = 1; i < fds.size(); ++i)
    if (fds[i].revents) readHello(arrivals_[i - 1]);
  if (fds[0].revents) acceptArrivals();

  const auto now = Clock::now();
  for (Arrival& arrival : arrivals_)
    if (arrival.socket.valid() && now >= arrival.expires)
      arrival.drop(rank_, "no hello within 2 s");
  arrivals_.erase(std::remove_if(arrivals_.begin(), arrivals_.end(),
                                 [](const Arrival& a) { return !a.socket.valid(); }),
                  arrivals_.end());
}

void Bootstrap::acceptArrivals() {
  for (;;) {
    net::Socket socket = listener_.accept(Clock::now());  // takes what is there, never waits
    if (!socket.valid()) return;
    Arrival arrival;
    try {
      arrival.from = socket.peerAddress();
    } catch (const Error&) {
      continue;  // reset before we took it
    }
    arrival.socket = std::move(socket);
    arrival.expires = Clock::now() + kHelloWithin;
    arrivals_.push_back(std::move(arrival));
  }
}

void Bootstrap::readHello(Arrival& arrival) {
  ssize_t got = ::recv(arrival.socket.fd(), arrival.hello.data() + arrival.have,
                       kHelloBytes - arrival.have, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (got <= 0)
    return arrival.drop(rank_, got == 0 ? "closed before its hello" : std::strerror(errno));
  arrival.have += static_cast<size_t>(got);
  if (arrival.have < kHelloBytes) return;
  Key key;
  std::string why = checkHello(arrival.hello.data(), secret_, size(), &key);
  if (!why.empty()) return arrival.drop(rank_, why);
  pending_.emplace(key, std::move(arrival.socket));
}

// --- OOB collectives ---------------------------------------------------------

void Bootstrap::allGather(void* data, size_t bytesPerRank, net::Deadline deadline) {
  gather(data, bytesPerRank, deadline, "allGather");
}

void Bootstrap::barrier(net::Deadline deadline) {
  std::vector<uint8_t> token(static_cast<size_t>(size()));
  gather(token.data(), 1, deadline, "barrier");
}

// Ring allgather: n-1 steps; in step s rank r sends block (r-s) mod n to r+1
// and receives block (r-s-1) mod n from r-1, each block behind a header that
// carries its length. (n-1)·S bytes sent per rank for blocks of S bytes.
void Bootstrap::gather(void* data, size_t bytesPerRank, net::Deadline deadline, const char* op) {
  const int n = size();
  if (n == 1) return;
  if (ringFailure_) throw *ringFailure_;
  try {
    auto* blocks = static_cast<uint8_t*>(data);
    const int next = (rank_ + 1) % n;
    const int prev = (rank_ + n - 1) % n;
    for (int step = 0; step < n - 1; ++step) {
      const std::string where = format("OOB %s step %d of %d", op, step + 1, n - 1);
      Header out = encodeHeader(kBlockType, bytesPerRank);
      Header in{};
      exchange(rank_, {ringNext_.fd(), out.data(), kHeaderBytes, next},
               {ringPrev_.fd(), in.data(), kHeaderBytes, prev}, deadline, where);
      if (!isHeader(in.data(), kBlockType))
        fail(ErrorCode::Internal, rank_, where + format(": rank %d sent a malformed frame", prev));
      if (uint64_t theirs = get(in.data() + 8, 8); theirs != bytesPerRank)
        fail(ErrorCode::InvalidUsage, rank_,
             where + format(": rank %d gathers %llu bytes per rank, this rank %zu", prev,
                            static_cast<unsigned long long>(theirs), bytesPerRank));
      uint8_t* sendBlock = blocks + static_cast<size_t>((rank_ - step + n) % n) * bytesPerRank;
      uint8_t* recvBlock = blocks + static_cast<size_t>((rank_ - step - 1 + n) % n) * bytesPerRank;
      exchange(rank_, {ringNext_.fd(), sendBlock, bytesPerRank, next},
               {ringPrev_.fd(), recvBlock, bytesPerRank, prev}, deadline, where);
    }
  } catch (const Error& e) {
    ringFailure_ = e;
    throw;
  }
}

}  // namespace braid::bootstrap
