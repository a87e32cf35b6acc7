// The rendezvous: the root, and the rank side of its protocol.
//
// Frames between a rank and the root: a 16-byte header {u32 magic "BRDR",
// u32 type, u64 payload length}, little-endian, then the payload. A receiver
// checks the length against the type's limit before it allocates anything.
//   Register  rank -> root  {u64 secret, u32 nranks, u32 rank,
//                            u32 remaining timeout ms, address, host id}   at most 4 KiB
//   Table     root -> rank  {u32 nranks, nranks x (address, host id)}      at most nranks x 4 KiB
//   Refusal   root -> rank  {u32 error code, message}                      at most 16 KiB
// An address is {u16 family (4 or 6), u16 port, 16 bytes in network order,
// u32 IPv6 scope id}; a host id is {u16 length, bytes}, at most 1 KiB.
//
// The root is one thread with one poll() over its listener and every
// connection that has not registered yet; it reads each without blocking, so
// strangers (wrong secret, garbage, silence) cost it nothing but a slot, and
// are dropped with a warning after a bad byte or 2 s.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::bootstrap {
namespace {

using namespace std::chrono_literals;
using net::Clock;
using std::chrono::milliseconds;

constexpr uint32_t kFrameMagic = 0x52445242;  // "BRDR"
constexpr uint32_t kRegisterType = 1;
constexpr uint32_t kTableType = 2;
constexpr uint32_t kRefusalType = 3;
constexpr size_t kHeaderBytes = 16;

constexpr uint32_t kMaxRanks = 1u << 20;
constexpr uint64_t kMaxRegistrationBytes = 4096;
constexpr uint64_t kMaxTableBytesPerRank = 4096;
constexpr uint64_t kMaxRefusalBytes = 16384;
constexpr size_t kMaxHostIdBytes = 1024;
constexpr uint16_t kFamilyV4 = 4;
constexpr uint16_t kFamilyV6 = 6;

// A connection that has not sent its whole registration by then is dropped.
constexpr auto kRegisterWithin = 2s;
// The root answers this long before the earliest rank's own deadline, so that
// the rank hears which ranks are missing instead of timing out on its own.
constexpr milliseconds kAnswerMargin = 150ms;
// How long the root stops accepting when it runs out of file descriptors.
constexpr auto kAcceptPause = 100ms;

// A frame that breaks the protocol, or a connection the root gives up on.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds one frame: the header, then the payload appended field by field.
class Writer {
 public:
  explicit Writer(uint32_t type) : bytes_(kHeaderBytes) {
    store(0, kFrameMagic, 4);
    store(4, type, 4);
  }

  void u16(uint64_t value) { append(value, 2); }
  void u32(uint64_t value) { append(value, 4); }
  void u64(uint64_t value) { append(value, 8); }
  void raw(const void* data, size_t bytes) {
    auto* begin = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), begin, begin + bytes);
  }
  void text(const std::string& value) {
    u16(value.size());
    raw(value.data(), value.size());
  }
  void address(const net::Address& address);

  // The frame, with the payload length in its header.
  std::vector<uint8_t> finish() {
    store(8, bytes_.size() - kHeaderBytes, 8);
    return std::move(bytes_);
  }

 private:
  void store(size_t at, uint64_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) bytes_[at + i] = static_cast<uint8_t>(value >> (8 * i));
  }
  void append(uint64_t value, size_t bytes) {
    bytes_.resize(bytes_.size() + bytes);
    store(bytes_.size() - bytes, value, bytes);
  }

  std::vector<uint8_t> bytes_;
};

void Writer::address(const net::Address& address) {
  uint8_t bytes[16] = {};
  uint32_t scope = 0;
  if (address.family() == AF_INET) {
    u16(kFamilyV4);
    std::memcpy(bytes, &reinterpret_cast<const sockaddr_in*>(address.sockaddr_())->sin_addr, 4);
  } else {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(address.sockaddr_());
    u16(kFamilyV6);
    std::memcpy(bytes, &in6->sin6_addr, 16);
    scope = in6->sin6_scope_id;
  }
  u16(address.port());
  raw(bytes, sizeof(bytes));
  u32(scope);
}

// Reads a payload field by field; throws ProtocolError instead of reading past
// its end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit Reader(const std::vector<uint8_t>& payload) : Reader(payload.data(), payload.size()) {}

  uint64_t u16() { return load(2); }
  uint64_t u32() { return load(4); }
  uint64_t u64() { return load(8); }
  std::string text(size_t limit) {
    size_t length = u16();
    if (length > limit) throw ProtocolError(format("a string of %zu bytes", length));
    const uint8_t* begin = take(length);
    return std::string(begin, begin + length);
  }
  std::string rest() {
    size_t length = size_ - at_;
    const uint8_t* begin = take(length);
    return std::string(begin, begin + length);
  }
  net::Address address();
  void expectEnd() const {
    if (at_ != size_) throw ProtocolError("trailing bytes");
  }

 private:
  const uint8_t* take(size_t bytes) {
    if (bytes > size_ - at_) throw ProtocolError("truncated frame");
    const uint8_t* begin = data_ + at_;
    at_ += bytes;
    return begin;
  }
  uint64_t load(size_t bytes) {
    const uint8_t* begin = take(bytes);
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(begin[i]) << (8 * i);
    return value;
  }

  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

net::Address Reader::address() {
  const uint64_t family = u16();
  const auto port = static_cast<uint16_t>(u16());
  const uint8_t* bytes = take(16);
  const auto scope = static_cast<uint32_t>(u32());
  net::Address address;
  if (family == kFamilyV4) {
    sockaddr_in in{};
    in.sin_family = AF_INET;
    std::memcpy(&in.sin_addr, bytes, 4);
    address = net::Address::fromSockaddr(reinterpret_cast<sockaddr*>(&in), sizeof(in));
  } else if (family == kFamilyV6) {
    sockaddr_in6 in6{};
    in6.sin6_family = AF_INET6;
    std::memcpy(&in6.sin6_addr, bytes, 16);
    in6.sin6_scope_id = scope;
    address = net::Address::fromSockaddr(reinterpret_cast<sockaddr*>(&in6), sizeof(in6));
  } else {
    throw ProtocolError("an address of unknown family");
  }
  address.setPort(port);
  return address;
}

struct FrameHeader {
  uint32_t type;
  uint64_t length;
};

FrameHeader decodeHeader(const std::array<uint8_t, kHeaderBytes>& bytes) {
  Reader reader(bytes.data(), bytes.size());
  if (reader.u32() != kFrameMagic) throw ProtocolError("not a braid connection (bad magic)");
  FrameHeader header;
  header.type = static_cast<uint32_t>(reader.u32());
  header.length = reader.u64();
  return header;
}

std::vector<uint8_t> encodeRefusal(ErrorCode code, const std::string& why) {
  Writer writer(kRefusalType);
  writer.u32(static_cast<uint32_t>(code));
  writer.raw(why.data(), std::min<size_t>(why.size(), kMaxRefusalBytes - 4));
  return writer.finish();
}

// "3", "3, 4", "3-7": one run of missing ranks, as a person would list them.
void appendRun(std::string* list, int first, int last) {
  if (!list->empty()) *list += ", ";
  if (first == last) {
    *list += std::to_string(first);
  } else if (last == first + 1) {
    *list += format("%d, %d", first, last);
  } else {
    *list += format("%d-%d", first, last);
  }
}

// --- The root ----------------------------------------------------------------

// A connection whose registration has not fully arrived.
struct Arrival {
  net::Socket socket;
  net::Address from;
  net::Deadline expires;
  std::array<uint8_t, kHeaderBytes> header{};
  size_t headerHave = 0;
  std::vector<uint8_t> payload;  // sized once the header passed its checks
  size_t payloadHave = 0;
};

// Reads into `buffer` what the socket has now, without blocking.
size_t receiveSome(net::Socket& socket, uint8_t* buffer, size_t bytes) {
  if (bytes == 0) return 0;
  ssize_t got = ::recv(socket.fd(), buffer, bytes, MSG_DONTWAIT);
  if (got > 0) return static_cast<size_t>(got);
  if (got == 0) throw ProtocolError("closed the connection before registering");
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  throw ProtocolError(std::strerror(errno));
}

// Reads what has arrived; true once the whole registration frame is in.
bool receiveRegistration(Arrival& arrival) {
  if (arrival.headerHave < kHeaderBytes) {
    arrival.headerHave += receiveSome(arrival.socket, arrival.header.data() + arrival.headerHave,
                                      kHeaderBytes - arrival.headerHave);
    if (arrival.headerHave < kHeaderBytes) return false;
    FrameHeader header = decodeHeader(arrival.header);
    if (header.type != kRegisterType) throw ProtocolError("expected a registration");
    if (header.length > kMaxRegistrationBytes)
      throw ProtocolError(format("a registration of %llu bytes (the limit is %llu)",
                                 static_cast<unsigned long long>(header.length),
                                 static_cast<unsigned long long>(kMaxRegistrationBytes)));
    arrival.payload.resize(header.length);
  }
  arrival.payloadHave += receiveSome(arrival.socket, arrival.payload.data() + arrival.payloadHave,
                                     arrival.payload.size() - arrival.payloadHave);
  return arrival.payloadHave == arrival.payload.size();
}

class Root {
 public:
  Root(net::Listener listener, uint64_t secret, milliseconds idle)
      : listener_(std::move(listener)), secret_(secret), idleUntil_(Clock::now() + idle) {}

  // Serves one job, then returns.
  void run();

 private:
  // A rank that registered.
  struct Member {
    net::Socket socket;
    net::Address from;
    PeerInfo info;
    net::Deadline deadline;  // the rank's own
  };

  net::Deadline nextWake() const;
  void pollOnce();
  void acceptNewcomers();
  void readFrom(Arrival& arrival);
  void enroll(Arrival& arrival);
  void refuse(Arrival& arrival, const std::string& why);
  void answerAll(const std::vector<uint8_t>& frame);
  std::vector<uint8_t> encodeTable() const;
  std::string missingRanks() const;

  net::Listener listener_;
  uint64_t secret_;
  net::Deadline idleUntil_;  // exits then if nobody registered
  std::vector<Arrival> arrivals_;
  std::map<int, Member> members_;
  int nranks_ = 0;      // learned from the first registration
  int firstRank_ = -1;  // the rank that registered first
  net::Deadline giveUpAt_ = net::Deadline::max();
  net::Deadline acceptPausedUntil_{};
};

void Root::run() {
  const std::string where = listener_.address().toString();
  for (;;) {
    if (nranks_ > 0 && static_cast<int>(members_.size()) == nranks_) {
      answerAll(encodeTable());
      BRAID_DEBUG(Bootstrap, "root %s: all %d ranks joined", where.c_str(), nranks_);
      return;
    }
    const auto now = Clock::now();
    if (!members_.empty() && now >= giveUpAt_) {
      const std::string why = missingRanks() + " never joined";
      BRAID_WARN(Bootstrap, "root %s: giving up: %s", where.c_str(), why.c_str());
      answerAll(encodeRefusal(ErrorCode::Timeout, why));
      return;
    }
    if (members_.empty() && now >= idleUntil_) {
      BRAID_INFO(Bootstrap, "root %s: nobody registered; exiting", where.c_str());
      return;
    }
    pollOnce();
  }
}

net::Deadline Root::nextWake() const {
  net::Deadline wake = members_.empty() ? idleUntil_ : giveUpAt_;
  for (const Arrival& arrival : arrivals_) wake = std::min(wake, arrival.expires);
  if (acceptPausedUntil_ > Clock::now()) wake = std::min(wake, acceptPausedUntil_);
  return wake;
}

void Root::pollOnce() {
  const bool accepting = Clock::now() >= acceptPausedUntil_;
  std::vector<pollfd> fds{{accepting ? listener_.fd() : -1, POLLIN, 0}};
  for (const Arrival& arrival : arrivals_) fds.push_back({arrival.socket.fd(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), net::millisecondsUntil(nextWake())) < 0 && errno != EINTR)
    throw std::runtime_error(format("poll: %s", std::strerror(errno)));
  for (size_t i = 1; i < fds.size(); ++i)
    if (fds[i].revents) readFrom(arrivals_[i - 1]);
  if (fds[0].revents) acceptNewcomers();

  const auto now = Clock::now();
  for (Arrival& arrival : arrivals_) {
    if (arrival.socket.valid() && now >= arrival.expires) {
      BRAID_WARN(Bootstrap, "root: dropped a connection from %s: no registration within 2 s",
                 arrival.from.toString().c_str());
      arrival.socket.close();
    }
  }
  arrivals_.erase(std::remove_if(arrivals_.begin(), arrivals_.end(),
                                 [](const Arrival& a) { return !a.socket.valid(); }),
                  arrivals_.end());
}

void Root::acceptNewcomers() {
  for (;;) {
    net::Socket socket;
    try {
      socket = listener_.accept(Clock::now());  // takes what is there, never waits
    } catch (const Error& e) {                  // out of file descriptors, most likely
      BRAID_WARN(Bootstrap, "root: %s; not accepting for 100 ms", e.what());
      acceptPausedUntil_ = Clock::now() + kAcceptPause;
      return;
    }
    if (!socket.valid()) return;
    Arrival arrival;
    try {
      arrival.from = socket.peerAddress();
    } catch (const Error&) {
      continue;  // reset before we took it
    }
    arrival.socket = std::move(socket);
    arrival.expires = Clock::now() + kRegisterWithin;
    arrivals_.push_back(std::move(arrival));
  }
}

void Root::readFrom(Arrival& arrival) {
  try {
    if (receiveRegistration(arrival)) enroll(arrival);
  } catch (const ProtocolError& e) {
    BRAID_WARN(Bootstrap, "root: dropped a connection from %s: %s", arrival.from.toString().c_str(),
               e.what());
    arrival.socket.close();
  }
}

// Takes a complete registration: checks it, then the rank is a member (its
// socket moves out of the arrival) or is refused.
void Root::enroll(Arrival& arrival) {
  Reader reader(arrival.payload);
  if (reader.u64() != secret_) throw ProtocolError("wrong job secret");
  const uint64_t nranks = reader.u32();
  const uint64_t rank = reader.u32();
  const milliseconds timeout(reader.u32());
  PeerInfo info;
  info.listen = reader.address();
  info.hostId = reader.text(kMaxHostIdBytes);
  reader.expectEnd();
  if (nranks < 1 || nranks > kMaxRanks)
    throw ProtocolError(
        format("nranks %llu is out of range", static_cast<unsigned long long>(nranks)));

  if (rank >= nranks)
    return refuse(
        arrival, format("rank %llu is not below nranks %llu", static_cast<unsigned long long>(rank),
                        static_cast<unsigned long long>(nranks)));
  const auto r = static_cast<int>(rank);
  const auto n = static_cast<int>(nranks);
  if (nranks_ == 0) {
    nranks_ = n;
    firstRank_ = r;
  }
  if (n != nranks_)
    return refuse(arrival, format("rank %d joined a job of %d ranks, but rank %d joined one of %d",
                                  r, n, firstRank_, nranks_));
  if (auto it = members_.find(r); it != members_.end())
    return refuse(arrival,
                  format("rank %d joined twice, from %s and from %s", r,
                         it->second.from.toString().c_str(), arrival.from.toString().c_str()));

  Member member{std::move(arrival.socket), arrival.from, std::move(info), Clock::now() + timeout};
  giveUpAt_ = std::min(giveUpAt_, member.deadline - std::min(kAnswerMargin, timeout / 2));
  members_.emplace(r, std::move(member));
  BRAID_DEBUG(Bootstrap, "root: rank %d joined from %s (%zu of %d)", r,
              arrival.from.toString().c_str(), members_.size(), nranks_);
}

void Root::refuse(Arrival& arrival, const std::string& why) {
  BRAID_WARN(Bootstrap, "root: refused a registration from %s: %s", arrival.from.toString().c_str(),
             why.c_str());
  std::vector<uint8_t> frame = encodeRefusal(ErrorCode::InvalidUsage, why);
  try {
    arrival.socket.sendAll(frame.data(), frame.size(), Clock::now() + 1s, arrival.from.toString());
  } catch (const Error&) {
    // It left already; nobody else to tell.
  }
  arrival.socket.close();
}

void Root::answerAll(const std::vector<uint8_t>& frame) {
  for (auto& [rank, member] : members_) {
    try {
      member.socket.sendAll(frame.data(), frame.size(), member.deadline, format("rank %d", rank));
    } catch (const Error& e) {
      BRAID_WARN(Bootstrap, "root: could not answer rank %d: %s", rank, e.what());
    }
  }
}

std::vector<uint8_t> Root::encodeTable() const {
  Writer writer(kTableType);
  writer.u32(static_cast<uint32_t>(nranks_));
  for (const auto& [rank, member] : members_) {  // every rank, in rank order
    writer.address(member.info.listen);
    writer.text(member.info.hostId);
  }
  return writer.finish();
}

// "rank(s) 3, 4", "rank(s) 3-7, 9 and 12 more": the ranks that never registered.
std::string Root::missingRanks() const {
  constexpr int kMaxRuns = 32;
  std::string list;
  int runs = 0;
  int unlisted = 0;
  for (int first = 0; first < nranks_; ++first) {
    if (members_.count(first)) continue;
    int last = first;
    while (last + 1 < nranks_ && !members_.count(last + 1)) ++last;
    if (runs++ < kMaxRuns) {
      appendRun(&list, first, last);
    } else {
      unlisted += last - first + 1;
    }
    first = last;
  }
  if (unlisted > 0) list += format(" and %d more", unlisted);
  return "rank(s) " + list;
}

// --- The rank side -----------------------------------------------------------

std::vector<uint8_t> encodeRegistration(uint64_t secret, int nranks, int rank, milliseconds timeout,
                                        const PeerInfo& self) {
  Writer writer(kRegisterType);
  writer.u64(secret);
  writer.u32(static_cast<uint32_t>(nranks));
  writer.u32(static_cast<uint32_t>(rank));
  writer.u32(static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, UINT32_MAX)));
  writer.address(self.listen);
  writer.text(self.hostId.substr(0, kMaxHostIdBytes));
  return writer.finish();
}

struct Frame {
  uint32_t type;
  std::vector<uint8_t> payload;
};

// Reads the root's answer: a table or a refusal, its length checked first.
Frame receiveAnswer(net::Socket& socket, int nranks, net::Deadline deadline,
                    const std::string& root) {
  std::array<uint8_t, kHeaderBytes> bytes{};
  socket.recvAll(bytes.data(), bytes.size(), deadline, root);
  FrameHeader header = decodeHeader(bytes);
  uint64_t limit = 0;
  if (header.type == kTableType) limit = static_cast<uint64_t>(nranks) * kMaxTableBytesPerRank;
  if (header.type == kRefusalType) limit = kMaxRefusalBytes;
  if (limit == 0) throw ProtocolError(format("a frame of unknown type %u", header.type));
  if (header.length > limit)
    throw ProtocolError(format("a frame of %llu bytes (the limit is %llu)",
                               static_cast<unsigned long long>(header.length),
                               static_cast<unsigned long long>(limit)));
  Frame frame{header.type, std::vector<uint8_t>(header.length)};
  socket.recvAll(frame.payload.data(), frame.payload.size(), deadline, root);
  return frame;
}

std::vector<PeerInfo> decodeTable(const std::vector<uint8_t>& payload, int nranks) {
  Reader reader(payload);
  const uint64_t count = reader.u32();
  if (count != static_cast<uint64_t>(nranks))
    throw ProtocolError(format("a table of %llu ranks for a job of %d",
                               static_cast<unsigned long long>(count), nranks));
  std::vector<PeerInfo> table(count);
  for (PeerInfo& peer : table) {
    peer.listen = reader.address();
    peer.hostId = reader.text(kMaxHostIdBytes);
  }
  reader.expectEnd();
  return table;
}

[[noreturn]] void raiseRefusal(const std::vector<uint8_t>& payload, int rank, milliseconds timeout,
                               const std::string& root) {
  Reader reader(payload);
  const auto code = static_cast<ErrorCode>(reader.u32());
  const std::string why = reader.rest();
  if (code == ErrorCode::Timeout)
    fail(ErrorCode::Timeout, rank,
         format("init timed out after %lld ms: %s", static_cast<long long>(timeout.count()),
                why.c_str()));
  if (code == ErrorCode::InvalidUsage)
    fail(ErrorCode::InvalidUsage, rank,
         format("%s refused this rank: %s", root.c_str(), why.c_str()));
  fail(ErrorCode::Internal, rank, format("%s refused this rank: %s", root.c_str(), why.c_str()));
}

// Sends the registration and reads the answer, turning socket errors into
// ones that say what init was waiting for.
Frame askRoot(net::Socket& socket, const std::vector<uint8_t>& registration, int nranks, int rank,
              milliseconds timeout, net::Deadline deadline, const std::string& root) {
  try {
    socket.sendAll(registration.data(), registration.size(), deadline, root);
    return receiveAnswer(socket, nranks, deadline, root);
  } catch (const ProtocolError& e) {
    fail(ErrorCode::Internal, rank, format("%s answered with %s", root.c_str(), e.what()));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::Timeout)
      fail(ErrorCode::Timeout, rank,
           format("init timed out after %lld ms waiting for %s",
                  static_cast<long long>(timeout.count()), root.c_str()));
    if (e.code() == ErrorCode::RemoteError)
      fail(ErrorCode::RemoteError, rank,
           root + " closed the connection without an answer (is the UniqueId from this job?)");
    throw;
  }
}

net::Socket reachRoot(const net::Address& root, int rank, milliseconds timeout,
                      net::Deadline deadline) {
  try {
    return net::Socket::connect(root, deadline, "the root at " + root.toString());
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    fail(ErrorCode::Timeout, rank,
         format("init timed out after %lld ms: could not reach the root at %s",
                static_cast<long long>(timeout.count()), root.toString().c_str()));
  }
}

}  // namespace

void startRoot(net::Listener listener, uint64_t secret, milliseconds idle) {
  std::thread([listener = std::move(listener), secret, idle]() mutable {
    try {
      Root(std::move(listener), secret, idle).run();
    } catch (const std::exception& e) {  // the root never takes the process down
      BRAID_WARN(Bootstrap, "root stopped: %s", e.what());
    }
  }).detach();
}

std::vector<PeerInfo> Bootstrap::registerWithRoot(const IdContents& job, int nranks, int rank,
                                                  const PeerInfo& self, net::Deadline deadline) {
  if (nranks > static_cast<int>(kMaxRanks))
    fail(ErrorCode::InvalidArgument, rank,
         format("nranks %d is above the limit of %u", nranks, kMaxRanks));
  const milliseconds timeout =
      std::max(std::chrono::ceil<milliseconds>(deadline - Clock::now()), milliseconds(0));
  const std::string root = "the root at " + job.root.toString();

  net::Socket socket = reachRoot(job.root, rank, timeout, deadline);
  Frame answer = askRoot(socket, encodeRegistration(job.secret, nranks, rank, timeout, self),
                         nranks, rank, timeout, deadline, root);
  try {
    if (answer.type == kRefusalType) raiseRefusal(answer.payload, rank, timeout, root);
    return decodeTable(answer.payload, nranks);
  } catch (const ProtocolError& e) {
    fail(ErrorCode::Internal, rank, format("%s answered with %s", root.c_str(), e.what()));
  }
}

}  // namespace braid::bootstrap
