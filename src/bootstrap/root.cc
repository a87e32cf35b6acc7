// The rendezvous: the root, and the rank side of its protocol.
//
// The frames are in bootstrap/wire.h.
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
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/wire.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::bootstrap {
namespace {

// Roots of this process that are answering their ranks right now. A rank
// that a root of its own process refused waits for them before it fails:
// rank 0 usually hosts the root, and a rank 0 that gives up and exits at
// once would take the root with it before the other ranks heard why.
struct Answering {
  std::mutex mutex;
  std::condition_variable done;
  int roots = 0;
};
Answering& answering() {
  static Answering* instance = new Answering;  // never destroyed: detached roots use it
  return *instance;
}

void waitForLocalRoots(std::chrono::milliseconds longest) {
  Answering& a = answering();
  std::unique_lock<std::mutex> lock(a.mutex);
  a.done.wait_for(lock, longest, [&] { return a.roots == 0; });
}

using namespace std::chrono_literals;
using namespace wire;
using net::Clock;
using std::chrono::milliseconds;

// A connection that has not sent its whole registration by then is dropped.
constexpr auto kRegisterWithin = 2s;
// The root answers this long before the earliest rank's own deadline, so that
// the rank hears which ranks are missing instead of timing out on its own.
constexpr milliseconds kAnswerMargin = 150ms;
// How long the root stops accepting when it runs out of file descriptors.
constexpr auto kAcceptPause = 100ms;

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
  const Registration registration = decodeRegistration(arrival.payload);
  if (registration.secret != secret_) throw ProtocolError("wrong job secret");
  const uint64_t nranks = registration.nranks;
  const uint64_t rank = registration.rank;
  const milliseconds timeout = registration.timeout;
  PeerInfo info = registration.info;

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
  Answering& a = answering();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    ++a.roots;
  }
  struct Done {
    Answering& a;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(a.mutex);
        --a.roots;
      }
      a.done.notify_all();
    }
  } done{a};
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
  const uint64_t limit = header.type == kRegisterType ? 0 : payloadLimit(header.type, nranks);
  if (limit == 0) throw ProtocolError(format("a frame of unknown type %u", header.type));
  if (header.length > limit)
    throw ProtocolError(format("a frame of %llu bytes (the limit is %llu)",
                               static_cast<unsigned long long>(header.length),
                               static_cast<unsigned long long>(limit)));
  Frame frame{header.type, std::vector<uint8_t>(header.length)};
  socket.recvAll(frame.payload.data(), frame.payload.size(), deadline, root);
  return frame;
}

[[noreturn]] void raiseRefusal(const std::vector<uint8_t>& payload, int rank, milliseconds timeout,
                               const std::string& root) {
  const Refusal refusal = decodeRefusal(payload);
  const ErrorCode code = refusal.code;
  const std::string& why = refusal.why;
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
           root + " closed the connection without an answer (is the UniqueId from this job" +
               (socket.encrypted() ? ", and its secret the same as the root's?)" : "?)"));
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
    if (answer.type == kRefusalType) {
      waitForLocalRoots(milliseconds(1000));
      raiseRefusal(answer.payload, rank, timeout, root);
    }
    return decodeTable(answer.payload, nranks);
  } catch (const ProtocolError& e) {
    fail(ErrorCode::Internal, rank, format("%s answered with %s", root.c_str(), e.what()));
  }
}

}  // namespace braid::bootstrap
