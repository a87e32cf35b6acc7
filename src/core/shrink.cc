// shrink(): the survivors of a communicator make a smaller one among
// themselves, over the listeners they already have, without the excluded
// ranks taking part.
//
// The rendezvous is a star around a coordinator: the lowest rank still
// there. Every other survivor opens a listener for the new communicator and
// joins: it connects to the coordinator's bootstrap listener, sends its rank,
// that listener and what it knows (the excluded ranks; in an agreed shrink,
// the ranks it saw fail), and waits for the decision: the members with
// their listeners and the new job's secret, or an error.
//
// The coordinator acknowledges each join at once, and decides when every
// rank it expects has joined or is known to be gone. It holds a connection
// to each missing rank's listener, which the kernel resets when that
// process dies, so a dead rank is known at once, on this host or another;
// in an agreed shrink a rank some survivor saw fail is not waited for (it
// is a member all the same if it joins first), and one that neither joins
// nor dies by the deadline is left out as stopped.
//
// A joiner whose coordinator dies (its connection is refused or reset)
// turns to the next rank up. One that is there but does not answer is
// waited for until the timeout, never passed over: two groups of
// survivors could form otherwise. With the decision every member builds
// the communicator (Bootstrap::fromTable, then the usual wiring); in an
// agreed shrink, a member that dies meanwhile makes the others start over
// without it, in a round of their own.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <tuple>

#include "core/arguments.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kJoin = 0x4a4e5242;      // "BRNJ"
constexpr uint32_t kAck = 0x4b414252;       // "RBAK"
constexpr uint32_t kDecision = 0x43445242;  // "BRDC"
// One attempt to connect to a rank's listener (a joiner tries again until
// its deadline; a refusal means the rank is gone), and the coordinator's
// attempt at a watch on a rank it waits for.
constexpr auto kConnectAttempt = 1s;
constexpr auto kWatchAttempt = 200ms;
// How long the coordinator sleeps in the listener between looks at the
// ranks it waits for.
constexpr auto kLookEvery = 20ms;
constexpr int kMaxRounds = 8;  // agreed: child creations that lost a member

// The rendezvous of the shrink() calls number `index` of a communicator:
// joins and the coordinator's connections to the ranks it waits for.
uint32_t joinPurpose(uint64_t index) {
  return 0x40000000u | static_cast<uint32_t>(index & 0xffff) << 8;
}
uint32_t watchPurpose(uint64_t index) { return joinPurpose(index) | 0xff; }

struct JoinHeader {
  uint32_t magic;
  int32_t rank;
  uint32_t agreed;  // 1: shrink() without a list
  uint32_t round;
  char listen[128];  // this rank's listener for the new communicator
};

struct DecisionHeader {
  uint32_t magic;
  int32_t code;  // -1: the members follow; else an ErrorCode, and `what`
  uint32_t members;
  uint32_t round;
  uint64_t secret;
  char what[240];
};

struct Member {
  int32_t rank;
  char listen[128];
};

// What every rank of the parent is to this one: 0 expected, else out.
enum Known : uint8_t { kExpected = 0, kExcluded = 1, kSawFail = 2, kGone = 3 };

// Whether `socket` has something to read, or was closed or reset (the
// connections of the rendezvous carry nothing else while one waits).
bool readable(const net::Socket& socket) {
  pollfd entry{socket.fd(), POLLIN, 0};
  return ::poll(&entry, 1, 0) > 0;
}

// The members and how to reach them, as the coordinator decided.
struct Decision {
  std::vector<int> members;  // old ranks, ascending
  std::vector<std::string> listen;
  uint64_t secret = 0;
};

class Rendezvous {
 public:
  Rendezvous(Communicator::Impl& impl, std::vector<uint8_t> known, bool agreed)
      : impl_(impl),
        n_(impl.nranks),
        known_(std::move(known)),
        agreed_(agreed),
        purpose_(joinPurpose(impl.shrinks)),
        watch_(watchPurpose(impl.shrinks)) {}

  // Round `round`'s decision, with this rank's listener for the new
  // communicator at `listen`. Each round has the communicator's timeout.
  Decision run(const std::string& listen, uint32_t round) {
    listen_ = listen;
    round_ = round;
    deadline_ = deadlineAfter(impl_.timeout());
    // Ranks enter at different moments: a joiner waits for the decision
    // up to a timeout longer than the coordinator waits for the joins.
    decisionDeadline_ = deadline_ + impl_.timeout();
    for (int c = 0; c < n_; ++c) {
      if (known_[c] == kExcluded || known_[c] == kGone) continue;
      if (c == impl_.rank) return coordinate();
      if (std::optional<Decision> decided = join(c)) return *decided;
    }
    fail(ErrorCode::Internal, impl_.rank, "shrink: no coordinator left, this rank included");
  }

 private:
  [[noreturn]] void failHere(ErrorCode code, const std::string& what) const {
    fail(code, impl_.rank, "shrink: " + what);
  }

  [[noreturn]] void notAnswering(int c) const {
    failHere(ErrorCode::Timeout,
             format("rank %d, the lowest rank not known to be gone, did not answer within the "
                    "timeout (%lld ms); if it stopped, shrink() with a list that names it leaves "
                    "it out",
                    c, static_cast<long long>(impl_.timeout().count())));
  }

  // Joins coordinator `c`: the decision, or nothing when `c` is gone (its
  // listener refuses, or its connection closes before it decided). A
  // coordinator that is there but slow is waited for: passing it over
  // could make two groups of survivors.
  std::optional<Decision> join(int c) {
    net::Socket socket;
    for (;;) {
      int errnum = 0;
      socket = impl_.bootstrap->tryConnectTo(
          c, purpose_, std::min(deadline_, Clock::now() + kConnectAttempt), &errnum);
      if (socket.valid()) break;
      if (errnum == ECONNREFUSED || errnum == ECONNRESET)
        return passOver(c, "its listener refused the connection");
      if (Clock::now() >= deadline_) notAnswering(c);
    }
    std::vector<std::byte> message(sizeof(JoinHeader) + static_cast<size_t>(n_));
    JoinHeader header{};
    header.magic = kJoin;
    header.rank = impl_.rank;
    header.agreed = agreed_ ? 1 : 0;
    header.round = round_;
    std::snprintf(header.listen, sizeof(header.listen), "%s", listen_.c_str());
    std::memcpy(message.data(), &header, sizeof(header));
    std::memcpy(message.data() + sizeof(header), known_.data(), known_.size());
    const std::string who = format("coordinator %d", c);
    DecisionHeader decided{};
    try {
      socket.sendAll(message.data(), message.size(), deadline_, who);
      uint32_t ack = 0;
      socket.recvAll(&ack, sizeof(ack), deadline_, who);
      if (ack != kAck)
        failHere(ErrorCode::Internal, format("rank %d answered a join with %08x", c, ack));
      socket.recvAll(&decided, sizeof(decided), decisionDeadline_, who);
    } catch (const Error& error) {
      if (error.code() == ErrorCode::Timeout) notAnswering(c);
      if (error.code() != ErrorCode::RemoteError && error.code() != ErrorCode::SystemError) throw;
      return passOver(c, "its connection closed before it decided");
    }
    if (decided.magic != kDecision || decided.round != round_)
      failHere(ErrorCode::Internal, format("%s sent a malformed decision", who.c_str()));
    decided.what[sizeof(decided.what) - 1] = '\0';
    if (decided.code >= 0) throw Error(static_cast<ErrorCode>(decided.code), decided.what);
    return readMembers(socket, decided, who);
  }

  std::optional<Decision> passOver(int c, const char* why) {
    if (!agreed_)
      failHere(ErrorCode::RemoteError,
               format("rank %d, which is not excluded, is gone: %s", c, why));
    if (Clock::now() >= deadline_)
      failHere(
          ErrorCode::Timeout,
          format("rank %d, which coordinated, is gone (%s) and the timeout has passed", c, why));
    BRAID_INFO(Init, "shrink: rank %d is gone (%s): the next rank coordinates", c, why);
    known_[c] = kGone;
    return std::nullopt;
  }

  // The members the coordinator decided on, checked: ascending ranks of
  // this communicator.
  Decision readMembers(net::Socket& socket, const DecisionHeader& header, const std::string& who) {
    if (header.members == 0 || header.members > static_cast<uint32_t>(n_))
      failHere(ErrorCode::Internal,
               format("%s decided on %u members", who.c_str(), header.members));
    std::vector<Member> members(header.members);
    socket.recvAll(members.data(), members.size() * sizeof(Member), decisionDeadline_, who);
    Decision decision;
    decision.secret = header.secret;
    for (Member& member : members) {
      if (member.rank < 0 || member.rank >= n_ ||
          (!decision.members.empty() && member.rank <= decision.members.back()))
        failHere(ErrorCode::Internal,
                 format("%s decided on rank %d out of order or range", who.c_str(), member.rank));
      member.listen[sizeof(member.listen) - 1] = '\0';
      decision.members.push_back(member.rank);
      decision.listen.emplace_back(member.listen);
    }
    return decision;
  }

  struct Joiner {
    net::Socket socket;  // its join, or this rank's watch on its listener
    bool joined = false;
    std::string listen;
  };

  // This rank coordinates: waits for the joins, then decides.
  Decision coordinate() {
    std::vector<Joiner> ranks(static_cast<size_t>(n_));
    std::string problem;  // explicit lists that differ
    auto expected = [&](int r) { return r != impl_.rank && known_[r] == kExpected; };
    // A connection to each expected rank's listener, which the kernel
    // resets when that process dies. One that does not connect at once
    // is waited for without it.
    for (int r = 0; r < n_; ++r)
      if (expected(r)) {
        int errnum = 0;
        ranks[r].socket = impl_.bootstrap->tryConnectTo(
            r, watch_, std::min(deadline_, Clock::now() + kWatchAttempt), &errnum);
        if (errnum == ECONNREFUSED || errnum == ECONNRESET)
          gone(r, ranks, "its listener refused the connection");
      }
    for (;;) {
      bool waiting = false;
      for (int r = 0; r < n_; ++r) {
        Joiner& joiner = ranks[r];
        if (!joiner.socket.valid() || !readable(joiner.socket)) {
          waiting |= expected(r) && !joiner.joined;
          continue;
        }
        gone(r, ranks, joiner.joined ? "it closed its join" : "its process ended");
      }
      if (!goneProblem_.empty()) return refuse(ranks, ErrorCode::RemoteError, goneProblem_);
      if (!waiting) break;
      if (Clock::now() >= deadline_) {
        // The joins that came meanwhile count.
        for (auto [from, socket] = impl_.bootstrap->acceptAny(purpose_, Clock::now());
             socket.valid(); std::tie(from, socket) = impl_.bootstrap->acceptAny(purpose_, {}))
          admit(from, std::move(socket), ranks, &problem);
        std::vector<int> missing;
        for (int r = 0; r < n_; ++r)
          if (expected(r) && !ranks[r].joined) missing.push_back(r);
        if (missing.empty()) break;
        if (!agreed_)
          return refuse(ranks, ErrorCode::Timeout,
                        format("ranks %s, not excluded, did not call shrink within the timeout "
                               "(%lld ms)",
                               listOfRanks(missing).c_str(),
                               static_cast<long long>(impl_.timeout().count())));
        BRAID_WARN(Init, "shrink: ranks %s neither joined nor died within the timeout: left out",
                   listOfRanks(missing).c_str());
        for (int r : missing) {
          known_[r] = kGone;
          ranks[r].socket.close();
        }
        break;
      }
      auto [from, socket] =
          impl_.bootstrap->acceptAny(purpose_, std::min(deadline_, Clock::now() + kLookEvery));
      if (socket.valid()) admit(from, std::move(socket), ranks, &problem);
    }
    if (!problem.empty()) return refuse(ranks, ErrorCode::InvalidArgument, problem);
    return decide(ranks);
  }

  void gone(int r, std::vector<Joiner>& ranks, const char* why) {
    ranks[r].socket.close();
    ranks[r].joined = false;
    if (!agreed_ && known_[r] != kExcluded) {
      goneProblem_ = format("rank %d, which is not excluded, is gone: %s", r, why);
      known_[r] = kGone;
      return;
    }
    BRAID_INFO(Init, "shrink: rank %d is gone (%s)", r, why);
    known_[r] = kGone;
  }

  // A join from `from`: read, acknowledged, merged. One of an earlier
  // round (its sender has moved on) is dropped.
  void admit(int from, net::Socket socket, std::vector<Joiner>& ranks, std::string* problem) {
    const std::string who = format("rank %d", from);
    std::vector<std::byte> message(sizeof(JoinHeader) + static_cast<size_t>(n_));
    JoinHeader header{};
    try {
      socket.recvAll(message.data(), message.size(),
                     std::min(deadline_, Clock::now() + kConnectAttempt), who);
      std::memcpy(&header, message.data(), sizeof(header));
      if (header.magic != kJoin || header.rank != from || header.round < round_) return;
      const uint32_t ack = kAck;
      socket.sendAll(&ack, sizeof(ack), deadline_, who);
    } catch (const Error&) {
      return;  // it went away again
    }
    header.listen[sizeof(header.listen) - 1] = '\0';
    const auto* theirs = reinterpret_cast<const uint8_t*>(message.data() + sizeof(header));
    if ((header.agreed != 0) != agreed_) {
      *problem =
          format("rank %d called shrink() %s a list, rank %d %s one", from,
                 header.agreed ? "without" : "with", impl_.rank, agreed_ ? "without" : "with");
    } else if (!agreed_) {
      for (int r = 0; r < n_; ++r)
        if ((theirs[r] == kExcluded) != (known_[r] == kExcluded) && problem->empty())
          *problem = format("argument 'excluded' differs: rank %d %s rank %d, rank %d %s", from,
                            theirs[r] == kExcluded ? "excludes" : "keeps", r, impl_.rank,
                            known_[r] == kExcluded ? "excludes it" : "keeps it");
    } else {
      for (int r = 0; r < n_; ++r)  // what the joiner saw fail is not waited for
        if (theirs[r] != kExpected && known_[r] == kExpected && r != from && r != impl_.rank &&
            !ranks[r].joined) {
          known_[r] = theirs[r] == kGone ? kGone : kSawFail;
          ranks[r].socket.close();
        }
    }
    if (agreed_) known_[from] = kExpected;  // it is here, whatever others saw
    ranks[from].socket = std::move(socket);
    ranks[from].joined = true;
    ranks[from].listen = header.listen;
  }

  // Tells every joiner that the shrink failed, then throws the same here.
  [[noreturn]] Decision refuse(std::vector<Joiner>& ranks, ErrorCode code,
                               const std::string& what) {
    DecisionHeader header{};
    header.magic = kDecision;
    header.code = static_cast<int32_t>(code);
    header.round = round_;
    std::snprintf(header.what, sizeof(header.what), "braid: shrink: %s (said by coordinator %d)",
                  what.c_str(), impl_.rank);
    for (int r = 0; r < n_; ++r)
      if (ranks[r].joined) try {
          ranks[r].socket.sendAll(&header, sizeof(header), deadline_, format("rank %d", r));
        } catch (const Error&) {
        }
    failHere(code, what);
  }

  Decision decide(std::vector<Joiner>& ranks) {
    Decision decision;
    std::random_device random;
    decision.secret =
        impl_.bootstrap->secret() ^ (static_cast<uint64_t>(random()) << 32 ^ random());
    std::vector<Member> members;
    for (int r = 0; r < n_; ++r) {
      if (r != impl_.rank && !ranks[r].joined) continue;
      Member member{};
      member.rank = r;
      std::snprintf(member.listen, sizeof(member.listen), "%s",
                    r == impl_.rank ? listen_.c_str() : ranks[r].listen.c_str());
      members.push_back(member);
      decision.members.push_back(r);
      decision.listen.emplace_back(member.listen);
    }
    DecisionHeader header{};
    header.magic = kDecision;
    header.code = -1;
    header.members = static_cast<uint32_t>(members.size());
    header.round = round_;
    header.secret = decision.secret;
    for (int r = 0; r < n_; ++r)
      if (ranks[r].joined) try {
          const std::string who = format("rank %d", r);
          ranks[r].socket.sendAll(&header, sizeof(header), deadline_, who);
          ranks[r].socket.sendAll(members.data(), members.size() * sizeof(Member), deadline_, who);
        } catch (const Error&) {
          // It died just now: building the communicator fails on every
          // member, and an agreed shrink starts over without it.
        }
    return decision;
  }

  Communicator::Impl& impl_;
  const int n_;
  std::vector<uint8_t> known_;
  const bool agreed_;
  const uint32_t purpose_, watch_;
  net::Deadline deadline_{}, decisionDeadline_{};  // this round's
  std::string listen_;
  uint32_t round_ = 0;
  std::string goneProblem_;  // explicit: a rank not excluded is gone
};

}  // namespace

namespace {

// The ranks this rank saw fail, as braid's failure notices said: the one
// its failure blames, and peers whose connection closed naming a failed
// rank, or closed for good without a word.
std::vector<uint8_t> sawFail(Communicator::Impl& impl) {
  std::vector<uint8_t> known(static_cast<size_t>(impl.nranks), kExpected);
  {
    std::lock_guard<std::mutex> lock(impl.failureMutex);
    if (impl.failureBlames >= 0 && impl.failureBlames != impl.rank &&
        impl.failureReason != transport::GiveUpReason::Revoked)
      known[impl.failureBlames] = kSawFail;
  }
  for (int peer = 0; peer < impl.nranks; ++peer) {
    const transport::Connection* connection = impl.wiring.connections[peer];
    if (peer == impl.rank || !connection || !connection->peerClosed()) continue;
    const int failed = connection->failedRank();
    if (failed < 0)
      known[peer] = kSawFail;  // it left or died: if it is alive after all, it joins
    else if (failed != impl.rank && connection->peerReason() != transport::GiveUpReason::Revoked)
      known[failed] = kSawFail;
  }
  return known;
}

}  // namespace

std::unique_ptr<Communicator::Impl> Communicator::Impl::shrinkTo(std::vector<uint8_t> known,
                                                                 bool agreed, bool abortPending) {
  if (groupDepth > 0) fail(ErrorCode::InvalidUsage, rank, "shrink inside a group");
  if (abortPending) {
    recordFailure(Error(ErrorCode::Aborted,
                        format("braid rank %d: the communicator was aborted by shrink", rank)));
    aborted.store(true);
  }
  waitForAsyncIdle();
  // A retired parent tells its peers now, as its destruction would: a
  // connection that ended with its last word may be carried on over.
  if (failed.load(std::memory_order_acquire) && !gaveUp) giveUp(-1);
  if (agreed) known = sawFail(*this);  // (the connections are this thread's now)
  Rendezvous rendezvous(*this, std::move(known), agreed);
  for (uint32_t round = 0;; ++round) {
    net::Address at = bootstrap->listenAddress();
    at.setPort(0);
    net::Listener listener(at);
    const Decision decision = rendezvous.run(listener.address().toString(), round);
    std::vector<bootstrap::PeerInfo> table;
    int newRank = -1;
    for (size_t i = 0; i < decision.members.size(); ++i) {
      const int r = decision.members[i];
      if (r == rank) newRank = static_cast<int>(i);
      table.push_back({net::Address::parse(decision.listen[i], "shrink listen address"),
                       bootstrap->table()[r].hostId});
    }
    if (newRank < 0)
      fail(ErrorCode::RemoteError, rank,
           "shrink: the other ranks made the new communicator without this one (they saw it "
           "fail or stop)");
    Knobs childKnobs = knobs;
    childKnobs.timeout = timeout();
    try {
      // A timeout of its own: the rendezvous may have waited its whole
      // timeout for a rank that stopped.
      auto boot = bootstrap::Bootstrap::fromTable(std::move(listener), std::move(table), newRank,
                                                  decision.secret, deadlineAfter(timeout()));
      const Lineage lineage{*this, decision.members};
      auto child = std::make_unique<Impl>(std::move(boot), childKnobs, &lineage);
      BRAID_INFO(Init, "shrink: rank %d of %d is rank %d of %zu", rank, nranks, newRank,
                 decision.members.size());
      return child;
    } catch (const Error& error) {
      if (!agreed || round + 1 == kMaxRounds) throw;
      BRAID_WARN(Init, "shrink: a member failed while the new communicator was made (%s): again",
                 error.what());
    }
  }
}

Communicator Communicator::shrink(const std::vector<int>& excluded, ShrinkFlags flags) {
  if (!impl_) usable(nullptr, "shrink");
  Impl& impl = *impl_;
  // Counted on every call, refused or not, so that the ranks' later
  // shrinks meet under the same number.
  ++impl.shrinks;
  ArgumentCheck check(impl, "shrink");
  std::vector<uint8_t> known(static_cast<size_t>(impl.nranks), kExpected);
  if (excluded.empty())
    check.reject("argument 'excluded' is empty: it names the ranks to leave out");
  for (size_t i = 0; i < excluded.size(); ++i) {
    const int r = excluded[i];
    if (r < 0 || r >= impl.nranks)
      check.reject(
          format("excluded[%zu] is %d, not a rank of this communicator of %d", i, r, impl.nranks));
    if (r == impl.rank)
      check.reject(
          format("excluded[%zu] is this rank (%d): an excluded rank does not call shrink", i, r));
    if (known[r] == kExcluded) check.reject(format("excluded[%zu] names rank %d twice", i, r));
    known[r] = kExcluded;
  }
  return Communicator(impl.shrinkTo(std::move(known), false, flags == ShrinkFlags::Abort));
}

Communicator Communicator::shrink() {
  if (!impl_) usable(nullptr, "shrink");
  Impl& impl = *impl_;
  ++impl.shrinks;
  return Communicator(impl.shrinkTo({}, true, true));
}

}  // namespace braid
