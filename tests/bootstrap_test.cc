// The bootstrap: UniqueId encoding, sockets, the rendezvous root, and the OOB
// ring. Ranks are threads of this process; every address is loopback.
#include "bootstrap/bootstrap.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"

namespace braid::bootstrap {
namespace {

using namespace std::chrono_literals;
using net::Clock;
using std::chrono::milliseconds;

// A test whose ranks are not all done by then has hung.
constexpr milliseconds kTestLimit = 30s;
constexpr uint32_t kPurposeA = static_cast<uint32_t>(Purpose::kTransportBase);
constexpr uint32_t kPurposeB = kPurposeA + 1;

net::Deadline after(milliseconds wait) { return Clock::now() + wait; }

uint64_t randomSecret() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) | device();
}

// Starts a root on loopback for one job and returns the job's id.
UniqueId startJob(milliseconds idle = 10s) {
  net::Listener listener(net::Address::loopback());
  const uint64_t secret = randomSecret();
  UniqueId id = encodeId({listener.address(), secret});
  startRoot(std::move(listener), secret, idle);
  return id;
}

// A loopback port that nobody listens on (it was free a moment ago).
uint16_t unusedPort() {
  net::Listener probe(net::Address::loopback());
  return probe.address().port();
}

template <typename T>
struct Outcome {
  std::optional<T> value;
  std::exception_ptr error;
};

// Runs fn(rank) for every rank on its own thread and returns what each
// returned or threw. When they are not all done within `limit` the test fails
// instead of hanging; the threads then own everything they touch (fn is
// copied, the results are shared) so they can finish on their own.
template <typename T, typename Fn>
std::vector<Outcome<T>> runRanks(int nranks, Fn fn, milliseconds limit = kTestLimit) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done;
    int finished = 0;
    std::vector<Outcome<T>> outcomes;
  };
  auto shared = std::make_shared<Shared>();
  shared->outcomes.resize(static_cast<size_t>(nranks));
  for (int rank = 0; rank < nranks; ++rank) {
    std::thread([shared, fn, rank] {
      Outcome<T> outcome;
      try {
        outcome.value = fn(rank);
      } catch (...) {
        outcome.error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->outcomes[static_cast<size_t>(rank)] = std::move(outcome);
      ++shared->finished;
      shared->done.notify_all();
    }).detach();
  }
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done.wait_for(lock, limit, [&] { return shared->finished == nranks; })) {
    ADD_FAILURE() << "ranks still running after " << limit.count() << " ms";
    return {};
  }
  return std::move(shared->outcomes);  // the threads no longer touch them
}

// What the outcome threw, as text ("" if it returned).
std::string messageOf(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

// The braid::Error it threw; nullopt (and a failure) when it threw nothing or
// something else.
std::optional<Error> errorOf(const std::exception_ptr& error) {
  if (!error) {
    ADD_FAILURE() << "expected a braid::Error, got none";
    return std::nullopt;
  }
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e;
  } catch (...) {
    ADD_FAILURE() << "expected a braid::Error, got: " << messageOf(error);
  }
  return std::nullopt;
}

template <typename Fn>
std::optional<Error> errorFrom(Fn fn) {
  try {
    fn();
  } catch (...) {
    return errorOf(std::current_exception());
  }
  ADD_FAILURE() << "expected a braid::Error, got none";
  return std::nullopt;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// --- UniqueId ----------------------------------------------------------------

TEST(UniqueId, EncodeDecodeRoundTripsIPv4AndIPv6Roots) {
  for (const char* text : {"127.0.0.1:29500", "[::1]:1234", "10.1.2.3:65535"}) {
    const IdContents in{net::Address::parse(text, "root"), 0x0123456789abcdefULL};
    const IdContents out = decodeId(encodeId(in));
    EXPECT_EQ(out.root.toString(), text);
    EXPECT_EQ(out.root.family(), in.root.family());
    EXPECT_EQ(out.secret, 0x0123456789abcdefULL);
  }
}

TEST(UniqueId, BytesAreMagicVersionFamilyPortAddressSecretThenZeros) {
  const UniqueId id =
      encodeId({net::Address::parse("127.0.0.1:29500", "root"), 0x1122334455667788});
  auto byte = [&](size_t i) { return static_cast<int>(id.bytes[i]); };
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(id.bytes.data()), 4), "BRD1");
  EXPECT_EQ(byte(4) | byte(5) << 8, 1);      // version
  EXPECT_EQ(byte(6) | byte(7) << 8, 4);      // IPv4
  EXPECT_EQ(byte(8) | byte(9) << 8, 29500);  // port
  EXPECT_EQ((std::vector<int>{byte(10), byte(11), byte(12), byte(13)}),
            (std::vector<int>{127, 0, 0, 1}));
  EXPECT_EQ(byte(26), 0x88);  // secret, little-endian
  EXPECT_EQ(byte(33), 0x11);
  for (size_t i = 34; i < id.bytes.size(); ++i) EXPECT_EQ(byte(i), 0) << "byte " << i;
}

TEST(UniqueId, DecodeRejectsGarbageWithInvalidArgumentNamingUniqueId) {
  const UniqueId valid = encodeId({net::Address::loopback(29500), 7});
  std::vector<UniqueId> garbage(6, valid);
  garbage[0] = UniqueId{};  // never filled in
  std::mt19937 random(42);
  for (auto& b : garbage[1].bytes) b = static_cast<std::byte>(random());
  garbage[2].bytes[0] = std::byte{'X'};                      // magic
  garbage[3].bytes[4] = std::byte{2};                        // version 2
  garbage[4].bytes[6] = std::byte{9};                        // family 9
  garbage[5].bytes[8] = garbage[5].bytes[9] = std::byte{0};  // port 0
  for (size_t i = 0; i < garbage.size(); ++i) {
    std::optional<Error> error = errorFrom([&] { decodeId(garbage[i]); });
    ASSERT_TRUE(error) << "case " << i;
    EXPECT_EQ(error->code(), ErrorCode::InvalidArgument) << "case " << i;
    EXPECT_TRUE(contains(error->what(), "UniqueId")) << error->what();
  }
}

// --- Address and Socket --------------------------------------------------------

TEST(Address, ParsesIPv4IPv6AndHostNames) {
  net::Address v4 = net::Address::parse("127.0.0.1:29500", "BRAID_ROOT");
  EXPECT_EQ(v4.toString(), "127.0.0.1:29500");
  EXPECT_EQ(v4.port(), 29500);
  EXPECT_TRUE(v4.isLoopback());
  net::Address v6 = net::Address::parse("[::1]:80", "BRAID_ROOT");
  EXPECT_EQ(v6.family(), AF_INET6);
  EXPECT_EQ(v6.toString(), "[::1]:80");
  EXPECT_TRUE(v6.isLoopback());
  net::Address named = net::Address::parse("localhost:7", "BRAID_ROOT");
  EXPECT_TRUE(named.isLoopback());
  EXPECT_EQ(named.port(), 7);
  EXPECT_FALSE(net::Address::parse("10.0.0.1:1", "BRAID_ROOT").isLoopback());
}

TEST(Address, ParseRejectsMalformedTextNamingTheSetting) {
  for (const char* text :
       {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "::1:80", "[::1]80", ":80", "a:b"}) {
    std::optional<Error> error = errorFrom([&] { net::Address::parse(text, "BRAID_ROOT"); });
    ASSERT_TRUE(error) << text;
    EXPECT_EQ(error->code(), ErrorCode::InvalidArgument) << text;
    EXPECT_TRUE(contains(error->what(), "BRAID_ROOT")) << error->what();
  }
}

TEST(Socket, ConnectRetriesUntilTheListenerAppears) {
  const uint16_t port = unusedPort();
  auto lateListener = std::async(std::launch::async, [port] {
    std::this_thread::sleep_for(300ms);
    net::Listener listener(net::Address::loopback(port));
    return listener.accept(after(5s)).valid();
  });
  const auto start = Clock::now();
  net::Socket socket = net::Socket::connect(net::Address::loopback(port), after(5s), "late");
  EXPECT_TRUE(socket.valid());
  EXPECT_GE(Clock::now() - start, 250ms);
  ASSERT_EQ(lateListener.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(lateListener.get());
}

TEST(Socket, ConnectToNobodyTimesOutNamingThePeer) {
  const auto start = Clock::now();
  std::optional<Error> error = errorFrom([] {
    net::Socket::connect(net::Address::loopback(unusedPort()), after(300ms), "nobody at all");
  });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::Timeout);
  EXPECT_TRUE(contains(error->what(), "nobody at all")) << error->what();
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(Socket, SilentPeerTimesOutAndClosedPeerIsARemoteError) {
  net::Listener listener(net::Address::loopback());
  net::Socket client = net::Socket::connect(listener.address(), after(2s), "listener");
  net::Socket server = listener.accept(after(2s));
  ASSERT_TRUE(server.valid());
  char buffer[4];

  std::optional<Error> silent =
      errorFrom([&] { server.recvAll(buffer, sizeof(buffer), after(200ms), "the client"); });
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->code(), ErrorCode::Timeout);
  EXPECT_TRUE(contains(silent->what(), "waiting for the client")) << silent->what();

  client.close();
  std::optional<Error> closed =
      errorFrom([&] { server.recvAll(buffer, sizeof(buffer), after(2s), "the client"); });
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->code(), ErrorCode::RemoteError);
  EXPECT_TRUE(contains(closed->what(), "the client closed the connection")) << closed->what();

  std::vector<char> block(1 << 16);
  std::optional<Error> sending = errorFrom([&] {
    for (int i = 0; i < 100; ++i)
      server.sendAll(block.data(), block.size(), after(2s), "the client");
  });
  ASSERT_TRUE(sending);
  EXPECT_EQ(sending->code(), ErrorCode::RemoteError);
}

TEST(Interfaces, LoopbackIsFoundByNameAndByRoute) {
  EXPECT_EQ(net::interfaceAddress("lo").toString(), "127.0.0.1:0");
  EXPECT_EQ(net::routeTo(net::Address::loopback(29500)).toString(), "127.0.0.1:0");
  const net::Address fallback = net::defaultLocalAddress();
  EXPECT_TRUE(fallback.family() == AF_INET || fallback.family() == AF_INET6);
  EXPECT_EQ(fallback.port(), 0);
}

TEST(Interfaces, UnknownInterfaceIsAnInvalidArgumentNamingTheKnob) {
  std::optional<Error> error = errorFrom([] { net::interfaceAddress("nosuchif9"); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(error->what(), "BRAID_SOCKET_IFNAME=nosuchif9")) << error->what();
}

// --- Rendezvous and OOB ring -----------------------------------------------------

// Rank r's byte i of a 1 MiB block.
uint8_t pattern(int rank, size_t i) {
  return static_cast<uint8_t>(static_cast<size_t>(rank) * 37 + i * 7 + (i >> 10));
}

struct RingResult {
  std::vector<std::string> table;  // "address hostId" per rank
  std::vector<uint64_t> small;     // after allGather of 8 bytes per rank
  size_t bigMismatches = 0;        // wrong bytes after allGather of 1 MiB per rank
  Clock::time_point beforeBarrier;
  Clock::time_point afterBarrier;
};

class JoinAtSize : public testing::TestWithParam<int> {};

TEST_P(JoinAtSize, RanksShareOneTableAllGatherEveryBlockAndMeetAtTheBarrier) {
  const int nranks = GetParam();
  const UniqueId id = startJob();
  auto outcomes = runRanks<RingResult>(nranks, [id, nranks](int rank) {
    const net::Deadline deadline = after(20s);
    auto bootstrap = Bootstrap::join(id, nranks, rank, net::Address::loopback(), deadline);
    RingResult result;
    for (const PeerInfo& peer : bootstrap->table())
      result.table.push_back(peer.listen.toString() + " " + peer.hostId);

    result.small.assign(static_cast<size_t>(nranks), 0);
    result.small[static_cast<size_t>(rank)] = 1000 + static_cast<uint64_t>(rank);
    bootstrap->allGather(result.small.data(), sizeof(uint64_t), deadline);

    constexpr size_t kBlock = 1 << 20;
    std::vector<uint8_t> big(static_cast<size_t>(nranks) * kBlock);
    for (size_t i = 0; i < kBlock; ++i)
      big[static_cast<size_t>(rank) * kBlock + i] = pattern(rank, i);
    bootstrap->allGather(big.data(), kBlock, deadline);
    for (int r = 0; r < nranks; ++r)
      for (size_t i = 0; i < kBlock; ++i)
        result.bigMismatches += big[static_cast<size_t>(r) * kBlock + i] != pattern(r, i);

    std::this_thread::sleep_for(milliseconds(30 * rank));  // arrive at different times
    result.beforeBarrier = Clock::now();
    bootstrap->barrier(deadline);
    result.afterBarrier = Clock::now();
    return result;
  });
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(nranks));

  std::vector<uint64_t> expectedSmall(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) expectedSmall[static_cast<size_t>(r)] = 1000 + r;
  Clock::time_point lastArrival{};
  for (const auto& outcome : outcomes) {
    ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
    lastArrival = std::max(lastArrival, outcome.value->beforeBarrier);
  }
  const std::vector<std::string>& table = outcomes[0].value->table;
  ASSERT_EQ(table.size(), static_cast<size_t>(nranks));
  for (const std::string& entry : table)
    EXPECT_TRUE(contains(entry, "127.0.0.1:") && contains(entry, " " + localHostId())) << entry;
  for (int r = 0; r < nranks; ++r) {
    const RingResult& result = *outcomes[static_cast<size_t>(r)].value;
    EXPECT_EQ(result.table, table) << "rank " << r;
    EXPECT_EQ(result.small, expectedSmall) << "rank " << r;
    EXPECT_EQ(result.bigMismatches, 0u) << "rank " << r;
    EXPECT_GE(result.afterBarrier, lastArrival) << "rank " << r << " left the barrier early";
  }
}

INSTANTIATE_TEST_SUITE_P(Bootstrap, JoinAtSize, testing::Values(1, 2, 3, 4, 5),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "Ranks";
                         });

TEST(Bootstrap, AcceptFromReturnsEachPeersConnectionForItsPurposeWhateverTheOrder) {
  const UniqueId id = startJob();
  // Rank 0 opens A then B to rank 1, rank 2 opens A; rank 1 asks for them in
  // another order and reads the byte each one carries.
  auto outcomes = runRanks<std::string>(3, [id](int rank) {
    const net::Deadline deadline = after(10s);
    auto bootstrap = Bootstrap::join(id, 3, rank, net::Address::loopback(), deadline);
    std::string received;
    std::vector<net::Socket> opened;
    auto open = [&](uint32_t purpose, char mark) {
      opened.push_back(bootstrap->connectTo(1, purpose, deadline));
      opened.back().sendAll(&mark, 1, deadline, "rank 1");
    };
    auto take = [&](int peer, uint32_t purpose) {
      net::Socket socket = bootstrap->acceptFrom(peer, purpose, deadline);
      char mark = 0;
      socket.recvAll(&mark, 1, deadline, "a peer");
      received += mark;
    };
    if (rank == 0) {
      open(kPurposeA, 'a');
      open(kPurposeB, 'b');
    } else if (rank == 2) {
      open(kPurposeA, 'c');
    } else {
      take(0, kPurposeB);
      take(2, kPurposeA);
      take(0, kPurposeA);
    }
    bootstrap->barrier(deadline);
    return received;
  });
  ASSERT_EQ(outcomes.size(), 3u);
  for (const auto& outcome : outcomes) ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
  EXPECT_EQ(*outcomes[1].value, "bca");
}

TEST(Bootstrap, AcceptFromTimesOutNamingThePeerThatNeverConnected) {
  const UniqueId id = startJob();
  auto outcomes = runRanks<std::string>(2, [id](int rank) -> std::string {
    auto bootstrap = Bootstrap::join(id, 2, rank, net::Address::loopback(), after(10s));
    if (rank == 0) return "";
    const auto start = Clock::now();
    std::optional<Error> error =
        errorFrom([&] { bootstrap->acceptFrom(0, kPurposeB, after(300ms)); });
    if (Clock::now() - start > 2s) return "waited too long";
    return error && error->code() == ErrorCode::Timeout ? error->what() : "no timeout";
  });
  ASSERT_EQ(outcomes.size(), 2u);
  ASSERT_TRUE(outcomes[1].value) << messageOf(outcomes[1].error);
  EXPECT_EQ(
      *outcomes[1].value,
      format("braid rank 1: timed out waiting for rank 0 to connect (purpose %u)", kPurposeB));
}

TEST(Bootstrap, FromTableFormsTheRingAmongRanksWhoseTableIsKnown) {
  constexpr int kRanks = 3;
  auto listeners = std::make_shared<std::vector<net::Listener>>();
  std::vector<PeerInfo> table;
  for (int r = 0; r < kRanks; ++r) {
    listeners->emplace_back(net::Address::loopback());
    table.push_back({listeners->back().address(), localHostId()});
  }
  auto outcomes = runRanks<std::vector<int>>(kRanks, [listeners, table](int rank) {
    const net::Deadline deadline = after(10s);
    auto bootstrap = Bootstrap::fromTable(std::move((*listeners)[static_cast<size_t>(rank)]), table,
                                          rank, 99, deadline);
    std::vector<int> values(kRanks, -1);
    values[static_cast<size_t>(rank)] = 11 * rank;
    bootstrap->allGather(values.data(), sizeof(int), deadline);
    return values;
  });
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(kRanks));
  for (const auto& outcome : outcomes) {
    ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
    EXPECT_EQ(*outcome.value, (std::vector<int>{0, 11, 22}));
  }
}

TEST(Bootstrap, AllGatherWithDifferentBlockSizesFailsWithInvalidUsageAndStaysFailed) {
  const UniqueId id = startJob();
  auto outcomes = runRanks<std::vector<std::string>>(2, [id](int rank) {
    const net::Deadline deadline = after(10s);
    auto bootstrap = Bootstrap::join(id, 2, rank, net::Address::loopback(), deadline);
    std::vector<uint8_t> blocks(64);
    const size_t bytesPerRank = rank == 0 ? 8 : 16;
    std::vector<std::string> messages;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::optional<Error> error =
          errorFrom([&] { bootstrap->allGather(blocks.data(), bytesPerRank, deadline); });
      messages.push_back(error && error->code() == ErrorCode::InvalidUsage ? error->what() : "");
    }
    return messages;
  });
  ASSERT_EQ(outcomes.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& outcome = outcomes[static_cast<size_t>(r)];
    ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
    const std::vector<std::string>& messages = *outcome.value;
    EXPECT_TRUE(contains(messages[0], format("braid rank %d: OOB allGather", r))) << messages[0];
    EXPECT_TRUE(contains(messages[0], format("rank %d gathers", 1 - r))) << messages[0];
    EXPECT_EQ(messages[1], messages[0]) << "a failed ring must stay failed";
  }
}

// --- Failures at init ------------------------------------------------------------

// How a join failed, and how long it took to.
struct JoinFailure {
  ErrorCode code;
  std::string what;
  milliseconds elapsed;
};

JoinFailure joinExpectingFailure(const UniqueId& id, int nranks, int rank, milliseconds timeout) {
  const auto start = Clock::now();
  try {
    Bootstrap::join(id, nranks, rank, net::Address::loopback(), after(timeout));
  } catch (const Error& e) {
    return {e.code(), e.what(), std::chrono::duration_cast<milliseconds>(Clock::now() - start)};
  }
  throw std::runtime_error(format("rank %d joined, but it should have failed", rank));
}

TEST(Bootstrap, MissingRankMakesEveryJoinedRankTimeOutNamingIt) {
  const UniqueId id = startJob();
  // Ranks 0-2 of 4 join with a 1.5 s timeout; rank 3 never does.
  auto outcomes = runRanks<JoinFailure>(
      3, [id](int rank) { return joinExpectingFailure(id, 4, rank, 1500ms); });
  ASSERT_EQ(outcomes.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const auto& outcome = outcomes[static_cast<size_t>(r)];
    ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
    const JoinFailure& failure = *outcome.value;
    EXPECT_EQ(failure.code, ErrorCode::Timeout) << failure.what;
    EXPECT_TRUE(contains(failure.what, format("braid rank %d: init timed out after", r)))
        << failure.what;
    EXPECT_TRUE(contains(failure.what, "rank(s) 3 never joined")) << failure.what;
    EXPECT_GE(failure.elapsed, 1000ms) << failure.what;
    EXPECT_LT(failure.elapsed, 2500ms) << failure.what;
  }
}

TEST(Bootstrap, JoinTimesOutNamingTheRootWhenNobodyListens) {
  const net::Address root = net::Address::loopback(unusedPort());
  const UniqueId id = encodeId({root, 42});
  const auto start = Clock::now();
  std::optional<Error> error =
      errorFrom([&] { Bootstrap::join(id, 2, 1, net::Address::loopback(), after(500ms)); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::Timeout);
  EXPECT_TRUE(contains(error->what(), "braid rank 1: init timed out")) << error->what();
  EXPECT_TRUE(contains(error->what(), "the root at " + root.toString())) << error->what();
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(Bootstrap, RootExitsWhenNobodyRegistersWithinIdle) {
  const UniqueId id = startJob(200ms);
  std::this_thread::sleep_for(600ms);
  std::optional<Error> error =
      errorFrom([&] { Bootstrap::join(id, 1, 0, net::Address::loopback(), after(300ms)); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::Timeout);
  EXPECT_TRUE(contains(error->what(), "could not reach the root at 127.0.0.1:")) << error->what();
}

TEST(Bootstrap, DuplicateRankIsRefusedWithInvalidUsage) {
  const UniqueId id = startJob();
  // Two ranks both claim rank 0 of 2; rank 1 never comes.
  auto outcomes = runRanks<bool>(2, [id](int) {
    Bootstrap::join(id, 2, 0, net::Address::loopback(), after(1500ms));
    return true;
  });
  ASSERT_EQ(outcomes.size(), 2u);
  std::vector<std::optional<Error>> errors = {errorOf(outcomes[0].error),
                                              errorOf(outcomes[1].error)};
  ASSERT_TRUE(errors[0] && errors[1]);
  if (errors[0]->code() != ErrorCode::InvalidUsage) std::swap(errors[0], errors[1]);
  const Error& refused = *errors[0];
  const Error& waited = *errors[1];
  EXPECT_EQ(refused.code(), ErrorCode::InvalidUsage);
  EXPECT_TRUE(contains(refused.what(), "braid rank 0: the root at 127.0.0.1:")) << refused.what();
  EXPECT_TRUE(contains(refused.what(), "refused this rank: rank 0 joined twice")) << refused.what();
  EXPECT_EQ(waited.code(), ErrorCode::Timeout);
  EXPECT_TRUE(contains(waited.what(), "rank(s) 1 never joined")) << waited.what();
}

TEST(Bootstrap, MismatchedNranksIsRefusedWithInvalidUsage) {
  const UniqueId id = startJob();
  // Rank 0 joins a job of 2; a moment later rank 1 joins one of 3.
  auto outcomes = runRanks<bool>(2, [id](int rank) {
    if (rank == 1) std::this_thread::sleep_for(200ms);
    Bootstrap::join(id, rank == 0 ? 2 : 3, rank, net::Address::loopback(), after(1500ms));
    return true;
  });
  ASSERT_EQ(outcomes.size(), 2u);
  std::optional<Error> first = errorOf(outcomes[0].error);
  std::optional<Error> second = errorOf(outcomes[1].error);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(second->code(), ErrorCode::InvalidUsage);
  EXPECT_TRUE(
      contains(second->what(), "rank 1 joined a job of 3 ranks, but rank 0 joined one of 2"))
      << second->what();
  EXPECT_EQ(first->code(), ErrorCode::Timeout);
  EXPECT_TRUE(contains(first->what(), "rank(s) 1 never joined")) << first->what();
}

// --- Strangers ---------------------------------------------------------------------

// Frames as a stranger might send them to the root: its header is {u32 magic
// "BRDR", u32 type (1 = register), u64 length}.
std::string rootHeader(uint64_t length) {
  std::string header("BRDR\x01\0\0\0", 8);
  for (int i = 0; i < 8; ++i) header += static_cast<char>(length >> (8 * i));
  return header;
}

// Opens `count` connections to `to` that misbehave in turn: garbage, a
// registration with the wrong secret, an oversized length, a partial header,
// and nothing at all (starting with the `first`th). Returns them, still open.
std::vector<net::Socket> openStrangers(const net::Address& to, int count, int first = 0) {
  const std::vector<std::string> sends = {
      std::string(64, '\xab'),
      rootHeader(40) + std::string(40, '\x5a'),  // secret 0x5a5a... is not the job's
      rootHeader(1ull << 40),
      "BRD",
      "",
  };
  std::vector<net::Socket> strangers;
  for (int i = 0; i < count; ++i) {
    net::Socket socket;
    try {
      socket = net::Socket::connect(to, after(200ms), "the root");
    } catch (const Error&) {
      break;  // the root finished its job and is gone
    }
    try {
      const std::string& bytes = sends[static_cast<size_t>(first + i) % sends.size()];
      socket.sendAll(bytes.data(), bytes.size(), after(200ms), "the root");
    } catch (const Error&) {
      // The root dropped it already.
    }
    strangers.push_back(std::move(socket));
  }
  return strangers;
}

TEST(Bootstrap, StrangersAtTheRootDoNotStopARealJobFromJoining) {
  const UniqueId id = startJob();
  const IdContents job = decodeId(id);
  std::vector<net::Socket> early = openStrangers(job.root, 100);
  EXPECT_EQ(early.size(), 100u);

  // A rank of another job (same root, other secret) is dropped, not answered.
  const UniqueId otherJob = encodeId({job.root, job.secret + 1});
  std::optional<Error> stranger =
      errorFrom([&] { Bootstrap::join(otherJob, 2, 0, net::Address::loopback(), after(3s)); });
  ASSERT_TRUE(stranger);
  EXPECT_EQ(stranger->code(), ErrorCode::RemoteError) << stranger->what();
  EXPECT_TRUE(contains(stranger->what(), "closed the connection")) << stranger->what();

  auto during =
      std::async(std::launch::async, [root = job.root] { return openStrangers(root, 100).size(); });
  auto outcomes = runRanks<std::vector<int>>(
      2,
      [id](int rank) {
        const net::Deadline deadline = after(10s);
        auto bootstrap = Bootstrap::join(id, 2, rank, net::Address::loopback(), deadline);
        std::vector<int> values{-1, -1};
        values[static_cast<size_t>(rank)] = rank + 40;
        bootstrap->allGather(values.data(), sizeof(int), deadline);
        return values;
      },
      5s);
  ASSERT_EQ(outcomes.size(), 2u);
  for (const auto& outcome : outcomes) {
    ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
    EXPECT_EQ(*outcome.value, (std::vector<int>{40, 41}));
  }
  ASSERT_EQ(during.wait_for(10s), std::future_status::ready);
}

// 10,000 bogus connections, 64 open at a time, each misbehaving in turn
// (garbage, wrong secret, oversized length, partial header, silence), do
// not stop a 3-rank job from initializing: the job joins once 9,900 have
// come, while the rest keep coming.
TEST(Bootstrap, TenThousandBogusConnectionsDoNotStopARealJob) {
  const UniqueId id = startJob();
  const IdContents job = decodeId(id);
  std::atomic<int> made{0};
  auto flood = std::async(std::launch::async, [&, root = job.root] {
    std::deque<net::Socket> open;
    while (made < 10000) {
      std::vector<net::Socket> one = openStrangers(root, 1, made);
      if (one.empty()) break;  // the root served the job and left
      ++made;
      open.push_back(std::move(one[0]));
      if (open.size() > 64) open.pop_front();
    }
  });
  const auto start = Clock::now();
  while (made < 9900 && Clock::now() - start < 60s) std::this_thread::sleep_for(1ms);
  ASSERT_GE(made.load(), 9900) << "the flood stalled: the root stopped accepting";
  auto outcomes = runRanks<std::vector<int>>(
      3,
      [id](int rank) {
        const net::Deadline deadline = after(20s);
        auto bootstrap = Bootstrap::join(id, 3, rank, net::Address::loopback(), deadline);
        std::vector<int> values{-1, -1, -1};
        values[static_cast<size_t>(rank)] = rank + 7;
        bootstrap->allGather(values.data(), sizeof(int), deadline);
        return values;
      },
      25s);
  ASSERT_EQ(outcomes.size(), 3u);
  for (const auto& outcome : outcomes) {
    ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
    EXPECT_EQ(*outcome.value, (std::vector<int>{7, 8, 9}));
  }
  ASSERT_EQ(flood.wait_for(30s), std::future_status::ready);
}

TEST(Bootstrap, RootClosesGarbageAtOnceAndSilentConnectionsAfterTwoSeconds) {
  const IdContents job = decodeId(startJob());
  net::Socket garbage = net::Socket::connect(job.root, after(2s), "the root");
  garbage.sendAll("GET / HTTP/1.1\r\n\r\n", 18, after(2s), "the root");
  net::Socket silent = net::Socket::connect(job.root, after(2s), "the root");
  const auto start = Clock::now();
  char byte;

  std::optional<Error> garbageClosed =
      errorFrom([&] { garbage.recvAll(&byte, 1, after(5s), "the root"); });
  ASSERT_TRUE(garbageClosed);
  EXPECT_EQ(garbageClosed->code(), ErrorCode::RemoteError) << garbageClosed->what();
  EXPECT_LT(Clock::now() - start, 1s);

  std::optional<Error> silentClosed =
      errorFrom([&] { silent.recvAll(&byte, 1, after(5s), "the root"); });
  ASSERT_TRUE(silentClosed);
  EXPECT_EQ(silentClosed->code(), ErrorCode::RemoteError) << silentClosed->what();
  EXPECT_GE(Clock::now() - start, 1500ms);
  EXPECT_LT(Clock::now() - start, 3500ms);

  // The root still serves a real job after both.
  auto outcomes = runRanks<int>(1, [id = encodeId(job)](int rank) {
    return Bootstrap::join(id, 1, rank, net::Address::loopback(), after(5s))->size();
  });
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_TRUE(outcomes[0].value) << messageOf(outcomes[0].error);
  EXPECT_EQ(*outcomes[0].value, 1);
}

TEST(Bootstrap, AcceptFromDropsStrangersWithoutWaitingOnThem) {
  const UniqueId id = startJob();
  // Rank 0 points 60 strangers at rank 1's listener (silent, garbage, a hello
  // with the wrong secret), then connects for real; rank 1 must not spend 2 s
  // on each silent one before it finds the real connection.
  auto outcomes = runRanks<milliseconds>(2, [id](int rank) {
    const net::Deadline deadline = after(15s);
    auto bootstrap = Bootstrap::join(id, 2, rank, net::Address::loopback(), deadline);
    std::vector<net::Socket> strangers;
    milliseconds waited{0};
    if (rank == 0) {
      std::string wrongHello("BRDP\x01\0\0\0\x10\0\0\0\0\0\0\0", 16);
      wrongHello += std::string(16, '\x01');
      const std::vector<std::string> sends = {"", std::string(40, '\x7f'), wrongHello};
      for (int i = 0; i < 60; ++i) {
        strangers.push_back(net::Socket::connect(bootstrap->table()[1].listen, deadline, "rank 1"));
        const std::string& bytes = sends[static_cast<size_t>(i) % sends.size()];
        strangers.back().sendAll(bytes.data(), bytes.size(), deadline, "rank 1");
      }
    }
    bootstrap->barrier(deadline);  // the strangers are queued at rank 1 now
    if (rank == 0) {
      net::Socket socket = bootstrap->connectTo(1, kPurposeA, deadline);
      socket.sendAll("x", 1, deadline, "rank 1");
    } else {
      const auto start = Clock::now();
      net::Socket socket = bootstrap->acceptFrom(0, kPurposeA, deadline);
      waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
      char mark = 0;
      socket.recvAll(&mark, 1, deadline, "rank 0");
      if (mark != 'x') throw std::runtime_error("wrong byte from rank 0");
    }
    bootstrap->barrier(deadline);  // rank 0 keeps its strangers open until here
    return waited;
  });
  ASSERT_EQ(outcomes.size(), 2u);
  for (const auto& outcome : outcomes) ASSERT_TRUE(outcome.value) << messageOf(outcome.error);
  EXPECT_LT(*outcomes[1].value, 1500ms);
}

}  // namespace
}  // namespace braid::bootstrap
