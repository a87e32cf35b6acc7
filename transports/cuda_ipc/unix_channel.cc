#include "transports/cuda_ipc/unix_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::transport::cuda_ipc {
namespace {

constexpr uint64_t kHelloMagic = 0x6272616964495043ull;  // "braidIPC"

struct Hello {
  uint64_t magic;
  uint64_t secret;
  int32_t rank;
  int32_t pad;
};

// An abstract address: a leading NUL, then the name.
sockaddr_un addressOf(const std::string& name, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

[[noreturn]] void failSys(const std::string& what, int err) {
  throw Error(ErrorCode::SystemError,
              format("braid: cuda_ipc: %s: %s", what.c_str(), std::strerror(err)));
}

bool waitReadable(int fd, net::Deadline deadline) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const int ready = ::poll(&p, 1, net::millisecondsUntil(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) failSys("poll", errno);
  }
}

}  // namespace

UnixListener::UnixListener() {
  std::random_device random;
  const uint64_t token = (static_cast<uint64_t>(random()) << 32) ^ random();
  name_ = format("braid-ipc-%d-%016llx", static_cast<int>(::getpid()),
                 static_cast<unsigned long long>(token));
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) failSys("socket(AF_UNIX)", errno);
  socklen_t length = 0;
  const sockaddr_un address = addressOf(name_, &length);
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::listen(fd_, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd_);
    failSys("bind/listen " + name_, err);
  }
}

UnixListener::~UnixListener() {
  if (fd_ >= 0) ::close(fd_);
}

net::Socket UnixListener::accept(uint64_t secret, int* peerRank, net::Deadline deadline) {
  for (;;) {
    if (!waitReadable(fd_, deadline))
      throw Error(ErrorCode::Timeout, "braid: cuda_ipc: timed out waiting for a peer to connect");
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      failSys("accept", errno);
    }
    net::Socket socket(fd);
    Hello hello{};
    try {
      // A stranger gets a short while to say hello, then is dropped.
      socket.recvAll(&hello, sizeof(hello),
                     std::min(deadline, net::Clock::now() + std::chrono::seconds(5)),
                     "a connecting process");
    } catch (const Error& error) {
      BRAID_WARN(Init, "cuda_ipc: dropped a connection that sent no hello: %s", error.what());
      continue;
    }
    if (hello.magic != kHelloMagic || hello.secret != secret) {
      BRAID_WARN(Init, "cuda_ipc: dropped a connection without this job's secret");
      continue;
    }
    *peerRank = hello.rank;
    return socket;
  }
}

net::Socket connectUnix(const std::string& name, uint64_t secret, int rank, net::Deadline deadline,
                        const std::string& who) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) failSys("socket(AF_UNIX)", errno);
  net::Socket socket(fd);
  socklen_t length = 0;
  const sockaddr_un address = addressOf(name, &length);
  // A Unix connect completes at once or, with the listener's backlog full,
  // fails with EAGAIN: then try again until the deadline.
  while (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN && net::Clock::now() < deadline) {
      ::usleep(1000);
      continue;
    }
    failSys(format("connect to %s", who.c_str()), errno);
  }
  const Hello hello{kHelloMagic, secret, rank, 0};
  socket.sendAll(&hello, sizeof(hello), deadline, who);
  return socket;
}

void sendWithFd(net::Socket& socket, const void* data, size_t bytes, int fd, net::Deadline deadline,
                const std::string& who) {
  iovec io{const_cast<void*>(data), bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  for (;;) {
    const ssize_t sent = ::sendmsg(socket.fd(), &message, MSG_NOSIGNAL);
    if (sent >= 0) {
      // The descriptor went with the first byte; the rest is plain data.
      const auto done = static_cast<size_t>(sent);
      if (done < bytes)
        socket.sendAll(static_cast<const char*>(data) + done, bytes - done, deadline, who);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{socket.fd(), POLLOUT, 0};
      if (::poll(&p, 1, net::millisecondsUntil(deadline)) == 0)
        throw Error(ErrorCode::Timeout,
                    format("braid: cuda_ipc: timed out sending a handle to %s", who.c_str()));
      continue;
    }
    throw Error(ErrorCode::RemoteError, format("braid: cuda_ipc: sending a handle to %s: %s",
                                               who.c_str(), std::strerror(errno)));
  }
}

int recvWithFd(net::Socket& socket, void* data, size_t bytes, net::Deadline deadline,
               const std::string& who) {
  int received = -1;
  size_t got = 0;
  while (got < bytes) {
    iovec io{static_cast<char*>(data) + got, bytes - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(socket.fd(), &message, MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* h = CMSG_FIRSTHDR(&message); h; h = CMSG_NXTHDR(&message, h))
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS && received < 0)
          std::memcpy(&received, CMSG_DATA(h), sizeof(int));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      throw Error(ErrorCode::RemoteError,
                  format("braid: cuda_ipc: %s closed the connection", who.c_str()));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitReadable(socket.fd(), deadline))
        throw Error(ErrorCode::Timeout,
                    format("braid: cuda_ipc: timed out waiting for a handle from %s", who.c_str()));
      continue;
    }
    throw Error(ErrorCode::RemoteError, format("braid: cuda_ipc: receiving from %s: %s",
                                               who.c_str(), std::strerror(errno)));
  }
  if (received < 0)
    throw Error(ErrorCode::RemoteError,
                format("braid: cuda_ipc: %s sent no memory handle", who.c_str()));
  return received;
}

}  // namespace braid::transport::cuda_ipc
