// TLS on braid's TCP sockets (bootstrap/tls.h): what a wiretap between two
// ends sees, what a tampered record or another secret does, and the
// process's choice. Ends are threads of this process over loopback.
#include "bootstrap/tls.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "braid/config.h"
#include "braid/error.h"

#if BRAID_HAVE_TLS

namespace braid::net {
namespace {

using namespace std::chrono_literals;

constexpr char kSecret[] = "a secret of more than thirty-two bytes, for tests";
constexpr char kOtherSecret[] = "another secret of more than thirty-two bytes, too";

Deadline after(std::chrono::milliseconds wait) { return Clock::now() + wait; }

std::shared_ptr<const TlsKey> key(const char* secret) {
  return TlsKey::fromSecret(secret, "the test's secret");
}

// `bytes` of plaintext that is easy to find again: a marker, repeated.
std::vector<uint8_t> marked(size_t bytes, const std::string& marker) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(marker[i % marker.size()]);
  return data;
}

bool holds(const std::vector<uint8_t>& haystack, const std::string& needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) !=
         haystack.end();
}

// Runs `body` in a child process of its own, where the process's choice of
// plaintext or a key starts unmade, whatever this one chose.
void inFreshProcess(const std::function<void()>& body) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        body();
        std::exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

std::optional<Error> errorFrom(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error;
  }
  return std::nullopt;
}

// A TCP relay between a client and `server` that records what passes each
// way, and can flip one byte of the client's stream at a given offset.
class Wiretap {
 public:
  explicit Wiretap(const Address& server, size_t flipAt = SIZE_MAX)
      : listener_(Address::loopback()), flipAt_(flipAt) {
    thread_ = std::thread([this, server] {
      Socket client = listener_.accept(after(10s));
      Socket upstream = Socket::connect(server, after(10s), "the server");
      relay(client.fd(), upstream.fd());
    });
  }
  ~Wiretap() { thread_.join(); }

  const Address& address() const { return listener_.address(); }
  // What went from the client to the server, and back. After the join.
  std::vector<uint8_t> fromClient() {
    std::lock_guard<std::mutex> lock(mutex_);
    return fromClient_;
  }
  std::vector<uint8_t> fromServer() {
    std::lock_guard<std::mutex> lock(mutex_);
    return fromServer_;
  }

 private:
  void relay(int client, int server) {
    bool clientOpen = true, serverOpen = true;
    std::vector<uint8_t> buffer(64 * 1024);
    while (clientOpen || serverOpen) {
      pollfd fds[2] = {{clientOpen ? client : -1, POLLIN, 0},
                       {serverOpen ? server : -1, POLLIN, 0}};
      if (::poll(fds, 2, 10000) <= 0) return;
      for (int side = 0; side < 2; ++side) {
        if (!fds[side].revents) continue;
        const int from = side == 0 ? client : server;
        const int to = side == 0 ? server : client;
        const ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
        if (n <= 0) {
          ::shutdown(to, SHUT_WR);
          (side == 0 ? clientOpen : serverOpen) = false;
          continue;
        }
        std::vector<uint8_t>& record = side == 0 ? fromClient_ : fromServer_;
        if (side == 0 && flipAt_ >= record.size() && flipAt_ < record.size() + size_t(n))
          buffer[flipAt_ - record.size()] ^= 0x20;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          record.insert(record.end(), buffer.begin(), buffer.begin() + n);
        }
        for (ssize_t sent = 0; sent < n;) {
          const ssize_t m = ::send(to, buffer.data() + sent, size_t(n - sent), MSG_NOSIGNAL);
          if (m <= 0) return;
          sent += m;
        }
      }
    }
  }

  Listener listener_;
  size_t flipAt_;
  std::mutex mutex_;
  std::vector<uint8_t> fromClient_, fromServer_;
  std::thread thread_;
};

// Two tunnelled ends through `tap`: the client made with `clientSecret`, the
// server with `serverSecret`.
struct Pair {
  Socket client, server;
};
Pair connectThrough(Listener& server, Wiretap& tap, const char* clientSecret,
                    const char* serverSecret) {
  Pair pair;
  Socket tcp = Socket::connect(tap.address(), after(10s), "the tap");
  pair.client = tunnel(std::move(tcp), TlsRole::Client, key(clientSecret), tap.address());
  Socket accepted = server.accept(after(10s));
  const Address from = accepted.peerAddress();
  pair.server = tunnel(std::move(accepted), TlsRole::Server, key(serverSecret), from);
  return pair;
}

// Two tunnelled ends straight over loopback, both with kSecret.
Pair connectDirect(Listener& server) {
  Pair pair;
  Socket tcp = Socket::connect(server.address(), after(5s), "the server");
  pair.client = tunnel(std::move(tcp), TlsRole::Client, key(kSecret), server.address());
  Socket accepted = server.accept(after(5s));
  pair.server = tunnel(std::move(accepted), TlsRole::Server, key(kSecret), server.address());
  return pair;
}

TEST(Tls, BytesArriveIntactBothWaysAndNeverInTheClearOnTheWire) {
  Listener server(Address::loopback());
  std::optional<Wiretap> tap(std::in_place, server.address());
  Pair pair = connectThrough(server, *tap, kSecret, kSecret);
  const std::string marker = "plaintext-marker-that-must-not-be-seen:";
  const auto up = marked(4 << 20, marker);
  const auto down = marked(1 << 20, marker);
  std::vector<uint8_t> gotUp(up.size()), gotDown(down.size());

  std::thread serverSide([&] {
    pair.server.sendAll(down.data(), down.size(), after(20s), "the client");
    pair.server.recvAll(gotUp.data(), gotUp.size(), after(20s), "the client");
  });
  pair.client.sendAll(up.data(), up.size(), after(20s), "the server");
  pair.client.recvAll(gotDown.data(), gotDown.size(), after(20s), "the server");
  serverSide.join();
  EXPECT_EQ(gotUp, up);
  EXPECT_EQ(gotDown, down);

  pair.client.close();
  pair.server.close();
  const auto fromClient = tap->fromClient();
  const auto fromServer = tap->fromServer();
  tap.reset();  // joins the relay
  EXPECT_GE(fromClient.size(), up.size());
  EXPECT_GE(fromServer.size(), down.size());
  EXPECT_FALSE(holds(fromClient, marker.substr(0, 16))) << "the client's plaintext was on the wire";
  EXPECT_FALSE(holds(fromServer, marker.substr(0, 16))) << "the server's plaintext was on the wire";
}

TEST(Tls, ATamperedRecordClosesTheConnectionInsteadOfDeliveringIt) {
  Listener server(Address::loopback());
  // Past the handshake (about 600 bytes from the client), inside the data.
  Wiretap tap(server.address(), 100 * 1024);
  Pair pair = connectThrough(server, tap, kSecret, kSecret);
  const auto data = marked(1 << 20, "tamper-test:");
  std::vector<uint8_t> got(data.size());
  std::thread clientSide([&] {
    try {
      pair.client.sendAll(data.data(), data.size(), after(10s), "the server");
    } catch (const Error&) {
      // The server's end closed: that is the point.
    }
  });
  std::optional<Error> error =
      errorFrom([&] { pair.server.recvAll(got.data(), got.size(), after(10s), "the client"); });
  clientSide.join();
  ASSERT_TRUE(error) << "a tampered stream was delivered whole";
  EXPECT_EQ(error->code(), ErrorCode::RemoteError) << error->what();
  pair.client.close();
  pair.server.close();
}

TEST(Tls, EndsWithDifferentSecretsNeverExchangeAByte) {
  Listener server(Address::loopback());
  Wiretap tap(server.address());
  Pair pair = connectThrough(server, tap, kSecret, kOtherSecret);
  const char hello[] = "hello";
  // What the client writes before the handshake fails is never delivered.
  std::thread clientSide([&] {
    try {
      pair.client.sendAll(hello, sizeof(hello), after(5s), "the server");
    } catch (const Error&) {
    }
  });
  char got[sizeof(hello)];
  const auto start = Clock::now();
  std::optional<Error> error =
      errorFrom([&] { pair.server.recvAll(got, sizeof(got), after(5s), "the client"); });
  clientSide.join();
  ASSERT_TRUE(error) << "the server read from a client with another secret";
  EXPECT_EQ(error->code(), ErrorCode::RemoteError) << error->what();
  EXPECT_LT(Clock::now() - start, 4s) << "a failed handshake should end the connection at once";
  pair.client.close();
  pair.server.close();
}

TEST(Tls, APlaintextPeerIsClosedAndNothingItSentIsDelivered) {
  Listener server(Address::loopback());
  Socket plain = Socket::connect(server.address(), after(5s), "the server");
  Socket accepted = server.accept(after(5s));
  Socket tls = tunnel(std::move(accepted), TlsRole::Server, key(kSecret), server.address());
  const char hello[] = "GET / HTTP/1.0\r\n\r\n";
  plain.sendAll(hello, sizeof(hello), after(5s), "the server");
  char got[sizeof(hello)];
  std::optional<Error> error =
      errorFrom([&] { tls.recvAll(got, sizeof(got), after(5s), "the plaintext peer"); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::RemoteError) << error->what();
}

TEST(Tls, AForkedChildClosingAnInheritedSocketLeavesTheParentsConnectionOpen) {
  Listener server(Address::loopback());
  auto [client, other] = connectDirect(server);
  const pid_t child = ::fork();
  if (child == 0) {
    client.close();  // the child's copy only
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string there = "still there", back = "and back";
  client.sendAll(there.data(), there.size(), after(5s), "the server");
  std::string got(there.size(), '\0');
  other.recvAll(got.data(), got.size(), after(5s), "the client");
  EXPECT_EQ(got, there);
  other.sendAll(back.data(), back.size(), after(5s), "the client");
  got.assign(back.size(), '\0');
  client.recvAll(got.data(), got.size(), after(5s), "the server");
  EXPECT_EQ(got, back);
}

// Descriptors this process has open.
long openDescriptors() {
  long count = 0;
  for (int fd = 0; fd < 4096; ++fd) count += ::fcntl(fd, F_GETFD) != -1;
  return count;
}

TEST(Tls, APeerThatConnectsAndStaysSilentIsDroppedOnceTheCallerLetsGo) {
  Listener server(Address::loopback());
  Socket silent = Socket::connect(server.address(), after(5s), "the server");  // plaintext
  Socket accepted = server.accept(after(5s));
  Socket end = tunnel(std::move(accepted), TlsRole::Server, key(kSecret), server.address());
  const long withLink = openDescriptors();
  end.close();  // as the bootstrap drops an arrival that never says hello
  const auto start = Clock::now();
  while (openDescriptors() > withLink - 3 && Clock::now() - start < 15s)
    std::this_thread::sleep_for(100ms);
  EXPECT_EQ(openDescriptors(), withLink - 3)
      << "the tunnel still holds the TCP socket of a handshake nobody waits for";
  EXPECT_LT(Clock::now() - start, 10s);
}

// What Socket::close() waits for: a process that writes, closes and ends
// at once by _exit (no exit handlers) has handed everything to TCP, where
// the kernel delivers it after the process is gone.
TEST(Tls, AProcessThatClosesAndExitsAtOnceHasSentEveryByte) {
  Listener server(Address::loopback());
  const auto data = marked(1 << 20, "before-exit:");
  const pid_t child = ::fork();
  if (child == 0) {
    Socket tcp = Socket::connect(server.address(), after(5s), "the server");
    Socket writer = tunnel(std::move(tcp), TlsRole::Client, key(kSecret), server.address());
    writer.sendAll(data.data(), data.size(), after(10s), "the reader");
    writer.close();
    ::_exit(0);
  }
  Socket accepted = server.accept(after(5s));
  ASSERT_TRUE(accepted.valid());
  Socket reader = tunnel(std::move(accepted), TlsRole::Server, key(kSecret), server.address());
  std::vector<uint8_t> got(data.size());
  std::optional<Error> error =
      errorFrom([&] { reader.recvAll(got.data(), got.size(), after(10s), "the writer"); });
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_FALSE(error) << error->what();
  EXPECT_EQ(got, data);
}

TEST(Tls, ClosingRightAfterWritingStillDeliversEveryByte) {
  Listener server(Address::loopback());
  auto [client, reader] = connectDirect(server);
  const auto data = marked(8 << 20, "last-words:");
  std::vector<uint8_t> got(data.size());
  std::thread readerSide([&] {
    std::this_thread::sleep_for(200ms);  // the writer is done and closed by now, mostly
    reader.recvAll(got.data(), got.size(), after(20s), "the writer");
    char more;
    std::optional<Error> end =
        errorFrom([&] { reader.recvAll(&more, 1, after(5s), "the writer"); });
    EXPECT_TRUE(end && end->code() == ErrorCode::RemoteError) << "a byte past the end";
  });
  client.sendAll(data.data(), data.size(), after(20s), "the reader");
  client.close();
  readerSide.join();
  EXPECT_EQ(got, data);
}

void plaintextIsTheDefaultAndOnceUsedStays() {
  ::unsetenv("BRAID_SOCKET_KEY_FILE");
  EXPECT_FALSE(socketKey()) << "plaintext is the default";
  // (socketKey() fixed plaintext: choosing a key now is refused.)
  std::optional<Error> late = errorFrom([&] { setSocketSecret(kSecret); });
  ASSERT_TRUE(late);
  EXPECT_EQ(late->code(), ErrorCode::InvalidUsage);
  EXPECT_NE(std::string(late->what()).find("in plaintext"), std::string::npos) << late->what();
}

void socketsAreTunnelledOnceASecretIsSet() {
  setSocketSecret(kSecret);
  setSocketSecret(kSecret);  // the same again is fine
  Listener server(Address::loopback());
  Wiretap tap(server.address());
  Socket client = Socket::connect(tap.address(), after(5s), "the tap");
  Socket accepted = server.accept(after(5s));
  ASSERT_TRUE(accepted.valid());
  EXPECT_TRUE(accepted.peerAddress().isLoopback()) << "the TCP peer, not the local pair";
  const std::string words = "words that travel encrypted";
  client.sendAll(words.data(), words.size(), after(5s), "the server");
  std::string got(words.size(), '\0');
  accepted.recvAll(got.data(), got.size(), after(5s), "the client");
  EXPECT_EQ(got, words);
  client.close();
  accepted.close();
  std::optional<Error> change = errorFrom([&] { setSocketSecret(""); });
  ASSERT_TRUE(change);
  EXPECT_EQ(change->code(), ErrorCode::InvalidUsage);
  EXPECT_NE(std::string(change->what()).find("already made encrypted"), std::string::npos)
      << change->what();
  std::optional<Error> other = errorFrom([&] { setSocketSecret(kOtherSecret); });
  ASSERT_TRUE(other);
  EXPECT_EQ(other->code(), ErrorCode::InvalidUsage);
}

void aShortSecretIsRefusedNamingIt() {
  ::unsetenv("BRAID_SOCKET_KEY_FILE");
  std::optional<Error> shortOne = errorFrom([&] { setSocketSecret("only 20 bytes long!!"); });
  ASSERT_TRUE(shortOne);
  EXPECT_EQ(shortOne->code(), ErrorCode::InvalidArgument);
  EXPECT_NE(std::string(shortOne->what()).find("20 bytes long: a secret has at least 32"),
            std::string::npos)
      << shortOne->what();
  EXPECT_FALSE(socketKey()) << "a refused secret left the choice as it was";
}

TEST(Tls, PlaintextIsTheDefaultAndOnceUsedStays) {
  inFreshProcess([] { plaintextIsTheDefaultAndOnceUsedStays(); });
}

TEST(Tls, SocketsFromConnectAndAcceptAreTunnelledOnceASecretIsSet) {
  inFreshProcess([] { socketsAreTunnelledOnceASecretIsSet(); });
}

TEST(Tls, AShortSecretIsRefusedNamingIt) {
  inFreshProcess([] { aShortSecretIsRefusedNamingIt(); });
}

}  // namespace
}  // namespace braid::net

#else

TEST(Tls, SkippedWithoutTls) { GTEST_SKIP() << "this braid was built without TLS (BRAID_TLS)"; }

#endif
