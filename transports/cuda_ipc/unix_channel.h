// Unix-domain stream sockets between processes of one host, for passing
// file descriptors (SCM_RIGHTS): how device memory (cuMem POSIX handles,
// or the emulated device's memfds) reaches the peers that map it.
//
// Listeners bind an abstract address (no file to clean up), named with a
// random token that only the job's ranks learn, through the bootstrap.
// Every connection starts with a hello carrying the job secret and the
// connecting rank; a connection without it is dropped with a warning.
#pragma once

#include <cstdint>
#include <string>

#include "bootstrap/socket.h"

namespace braid::transport::cuda_ipc {

class UnixListener {
 public:
  // Binds a fresh abstract address. Throws Error(SystemError).
  UnixListener();
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // The address, as peers pass it to connectUnix() (at most 63 bytes).
  const std::string& name() const { return name_; }

  // The next connection whose hello carries `secret`, with the rank it
  // names; strangers are dropped with a warning. Throws Error(Timeout).
  net::Socket accept(uint64_t secret, int* peerRank, net::Deadline deadline);

 private:
  int fd_ = -1;
  std::string name_;
};

// Connects to a listener's `name` and sends the hello {secret, rank}.
net::Socket connectUnix(const std::string& name, uint64_t secret, int rank, net::Deadline deadline,
                        const std::string& who);

// Sends `bytes` of `data` together with the file descriptor `fd` (which
// stays the caller's). Throws Error(RemoteError) naming `who`.
void sendWithFd(net::Socket& socket, const void* data, size_t bytes, int fd, net::Deadline deadline,
                const std::string& who);
// Receives exactly `bytes` and the one descriptor sent with them (returned;
// the caller owns it). Throws Error(RemoteError) when none came.
int recvWithFd(net::Socket& socket, void* data, size_t bytes, net::Deadline deadline,
               const std::string& who);

}  // namespace braid::transport::cuda_ipc
