// TLS 1.3 with a pre-shared key on braid's TCP sockets.
//
// Plaintext is the default. Once a key is set (setSocketKey(),
// ncclSetEncryption() or BRAID_SOCKET_KEY_FILE), every TCP connection braid
// makes or takes (the bootstrap's, the tcp transport's, the one-sided
// links', the ibverbs and tcp device links') is handed to the tunnel: one
// thread per process that runs each handshake and moves bytes between the
// TCP socket, where they travel encrypted and authenticated, and one end of
// a local socket pair, which the rest of braid uses exactly as it used the
// TCP socket. So no caller changes how it reads, writes or polls, and no
// handshake waits on what a caller's thread happens to be doing (two ranks
// connecting to each other at once complete both).
//
// Outside this boundary, as with NCCL's: shared memory and cuda_ipc (one
// host), and the data that ucx and ibverbs move themselves.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "bootstrap/socket.h"

namespace braid::net {

// The shortest secret taken, in bytes (NCCL's bound).
constexpr size_t kShortestSecret = 32;

// Whether this build can encrypt (BRAID_TLS found OpenSSL 3).
bool tlsBuilt();

// OpenSSL's oldest queued error as text, and the queue cleared; "" when it
// holds none.
std::string openSslError();

// A key both ends derive from the same secret, with the TLS context that
// uses it. Immutable; shared by the sockets made under it.
class TlsKey {
 public:
  // Throws Error(InvalidArgument) naming `what` when `secret` is shorter
  // than kShortestSecret, Error(InvalidUsage) when the build has no TLS.
  static std::shared_ptr<const TlsKey> fromSecret(std::string_view secret, const char* what);
  ~TlsKey();
  TlsKey(const TlsKey&) = delete;
  TlsKey& operator=(const TlsKey&) = delete;

  // 32 bytes: PBKDF2-HMAC-SHA256 of the secret (10^5 iterations).
  const std::array<uint8_t, 32>& bytes() const { return bytes_; }
  // Whether both keys came from the same secret.
  bool operator==(const TlsKey& other) const { return bytes_ == other.bytes_; }
  void* context() const { return context_; }  // the SSL_CTX

 private:
  TlsKey() = default;
  std::array<uint8_t, 32> bytes_{};
  void* context_ = nullptr;
};

// The process's choice for the sockets it makes from now on: a key, or
// nullptr for plaintext. Every process of a job must choose alike, before
// its first socket. Changing the choice once a socket was made under it
// throws Error(InvalidUsage) (setting the same again is allowed).
void setSocketKey(std::shared_ptr<const TlsKey> key);

// The key new sockets use, or nullptr. Without setSocketKey(), the first
// call reads BRAID_SOCKET_KEY_FILE (throwing Error(InvalidArgument) naming
// it when the file cannot be read or holds too short a secret). Fixes the
// choice: setSocketKey() may no longer change it.
std::shared_ptr<const TlsKey> socketKey();

enum class TlsRole { Client, Server };

// Hands the connected `tcp` socket to the tunnel, which starts the
// handshake as `role`, and returns the local end that stands for it: what
// is written there leaves encrypted; what arrives is read there in the
// clear. Closing the local end sends what is still on its way and then
// closes the TCP socket; a failed handshake or a record that does not
// authenticate closes the local end, with a warning naming `peer`.
Socket tunnel(Socket tcp, TlsRole role, std::shared_ptr<const TlsKey> key, const Address& peer);

// Socket::close() of a tunnel's local end: shuts its writing side and waits
// (at most a second) until the tunnel has sent what it held.
void closeTunnelled(int fd, TunnelEnd& end);

}  // namespace braid::net
