// One-sided communication on host windows: signal boards, the three ways a
// put reaches a peer, and the thread that serves staged pairs (one_sided.h).
#include "core/one_sided.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/communicator_impl.h"
#include "core/cpu_relax.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/memory.h"
#include "reduce/streaming.h"

namespace braid {
namespace {

// The bootstrap connections of staged pairs (tcp_transport.cc lists the
// transports' values below it).
constexpr uint32_t kPurpose = static_cast<uint32_t>(bootstrap::Purpose::kTransportBase) + 48;

// A wait first spins this long (a same-host peer's put lands within a
// microsecond or two), then sleeps on the board's bell, waking at least
// this often to look at the deadline and the communicator's state.
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kLongestSleep = std::chrono::milliseconds(10);

enum FrameKind : uint32_t {
  kPutFrame = 1,
  kSignalFrame = 2,
  kFenceFrame = 3,
  kDevicePutFrame = 4,     // into a device window; its signal on the device board
  kDeviceSignalFrame = 5,  // a signal alone, on the device board
};
constexpr uint32_t kNoSignal = UINT32_MAX;

// What a staged pair's socket carries before a put's bytes.
struct Frame {
  uint32_t kind;
  uint32_t signal;  // kNoSignal: none
  uint64_t window;
  uint64_t offset;
  uint64_t bytes;
};

// Puts of up to this many bytes leave in one write with their frame.
constexpr size_t kInlineBytes = 4096;

// Device memory crosses host memory in pieces of this size, each way.
constexpr size_t kDevicePiece = size_t{1} << 20;

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// A file descriptor of process `pid` (this one or another), as one of this
// process's: -1 with errno set when the kernel does not allow it.
int takeFd(int pid, int fd) {
  if (pid == ::getpid()) return ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return -1;
  const int taken = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  const int saved = errno;
  ::close(pidfd);
  errno = saved;
  return taken;
}

// Maps `bytes` of process `pid`'s file `fd`; nullptr when it cannot.
void* mapFd(int pid, int fd, size_t bytes) {
  const int taken = takeFd(pid, fd);
  if (taken < 0) return nullptr;
  void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, taken, 0);
  ::close(taken);
  return memory == MAP_FAILED ? nullptr : memory;
}

}  // namespace

// A rank's signal board, as this rank maps it.
struct OneSided::Board {
  struct alignas(64) Header {
    std::atomic<uint32_t> bell;      // bumped by a raise that finds sleepers
    std::atomic<uint32_t> sleepers;  // waits asleep on the bell now
  };
  void* memory = nullptr;
  size_t bytes = 0;
  int fd = -1;  // this rank's own board only: the memfd peers take

  static size_t sizeFor(int nranks) {
    const size_t used = sizeof(Header) + sizeof(uint64_t) * kSignals * static_cast<size_t>(nranks);
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return (used + page - 1) / page * page;
  }
  Header& header() const { return *static_cast<Header*>(memory); }
  std::atomic<uint64_t>* counts() const {
    return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<std::byte*>(memory) +
                                                    sizeof(Header));
  }
  ~Board() {
    if (memory) ::munmap(memory, bytes);
    if (fd >= 0) ::close(fd);
  }
};

// A registered window: this rank's part, and every rank's as this rank
// writes into it.
struct OneSided::Window {
  std::byte* base = nullptr;  // this rank's part
  size_t bytes = 0;
  bool onDevice = false;            // a device window: only staged puts land here
  std::vector<size_t> bytesOf;      // by rank
  std::vector<uint64_t> addressOf;  // by rank, in its own process (process_vm_writev)
  std::vector<std::byte*> at;       // by rank: where this rank stores into it; null: not mapped
  std::vector<std::pair<void*, size_t>> mappings;  // to unmap
  ~Window() {
    for (auto& [memory, length] : mappings) ::munmap(memory, length);
  }
};

// A staged pair's socket. The user's thread writes frames (sendMutex
// held); the server thread reads them.
struct OneSided::Link {
  net::Socket socket;
  std::mutex sendMutex;
  uint64_t fences = 0;  // fences read so far (fenceMutex_ held)
  std::atomic<bool> closed{false};
};

std::atomic<uint64_t>& OneSided::counter(Board& board, int source, int signal) const {
  return board.counts()[static_cast<size_t>(source) * kSignals + static_cast<size_t>(signal)];
}

OneSided::OneSided(Communicator::Impl& impl)
    : impl_(impl),
      rank_(impl.rank),
      nranks_(impl.nranks),
      reach_(static_cast<size_t>(impl.nranks), Reach::Staged),
      pids_(static_cast<size_t>(impl.nranks), 0),
      boards_(static_cast<size_t>(impl.nranks)),
      consumed_(static_cast<size_t>(impl.nranks) * kSignals, 0),
      links_(static_cast<size_t>(impl.nranks)) {
  const net::Deadline deadline = deadlineAfter(impl.timeout());
  bootstrap::Bootstrap& bootstrap = *impl.bootstrap;

  own_ = std::make_shared<Board>();
  own_->bytes = Board::sizeFor(nranks_);
  own_->fd = ::memfd_create("braid-signals", MFD_CLOEXEC);
  if (own_->fd < 0 || ::ftruncate(own_->fd, static_cast<off_t>(own_->bytes)) != 0)
    failSystem(rank_, "one-sided set-up: a signal board in memory", errno);
  own_->memory = ::mmap(nullptr, own_->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, own_->fd, 0);
  if (own_->memory == MAP_FAILED) {
    own_->memory = nullptr;
    failSystem(rank_, "one-sided set-up: mapping the signal board", errno);
  }

  struct Record {
    int32_t pid;
    int32_t boardFd;
  };
  std::vector<Record> records(static_cast<size_t>(nranks_));
  records[static_cast<size_t>(rank_)] = {::getpid(), own_->fd};
  bootstrap.allGather(records.data(), sizeof(Record), deadline);

  // Which boards this rank maps: every rank's of this process, and those of
  // same-host peers whose host buffers take a same-host transport.
  std::vector<uint8_t> maps(static_cast<size_t>(nranks_) * nranks_, 0);
  for (int peer = 0; peer < nranks_; ++peer) {
    const Record& theirs = records[static_cast<size_t>(peer)];
    pids_[static_cast<size_t>(peer)] = theirs.pid;
    if (peer == rank_) {
      boards_[static_cast<size_t>(peer)] = own_;
      maps[static_cast<size_t>(rank_) * nranks_ + peer] = 1;
      continue;
    }
    const bool local = theirs.pid == ::getpid();
    if (!local &&
        impl.wiring.entries[static_cast<size_t>(peer)]->reach == transport::Reach::AnyHost)
      continue;
    auto board = std::make_shared<Board>();
    board->bytes = own_->bytes;
    board->memory = mapFd(theirs.pid, theirs.boardFd, board->bytes);
    if (!board->memory) {
      BRAID_DEBUG(Init, "one-sided: rank %d's signals go through a socket: its board: %s", peer,
                  std::strerror(errno));
      continue;
    }
    boards_[static_cast<size_t>(peer)] = std::move(board);
    maps[static_cast<size_t>(rank_) * nranks_ + peer] = 1;
  }
  bootstrap.allGather(maps.data(), static_cast<size_t>(nranks_), deadline);

  std::vector<int> staged;
  for (int peer = 0; peer < nranks_; ++peer) {
    const bool both = maps[static_cast<size_t>(rank_) * nranks_ + peer] &&
                      maps[static_cast<size_t>(peer) * nranks_ + rank_];
    if (both) {
      reach_[static_cast<size_t>(peer)] =
          pids_[static_cast<size_t>(peer)] == ::getpid() ? Reach::Local : Reach::Near;
    } else {
      boards_[static_cast<size_t>(peer)].reset();
      staged.push_back(peer);
    }
  }
  // Staged pairs: the lower rank connects, the higher accepts (every
  // connect first: none waits for an accept).
  for (int peer : staged) {
    if (peer < rank_) continue;
    links_[static_cast<size_t>(peer)] = std::make_unique<Link>();
    links_[static_cast<size_t>(peer)]->socket = bootstrap.connectTo(peer, kPurpose, deadline);
  }
  for (int peer : staged) {
    if (peer > rank_) continue;
    links_[static_cast<size_t>(peer)] = std::make_unique<Link>();
    links_[static_cast<size_t>(peer)]->socket = bootstrap.acceptFrom(peer, kPurpose, deadline);
  }
  for (int peer : staged) links_[static_cast<size_t>(peer)]->socket.setNoDelay();
  if (!staged.empty()) {
    stopFd_ = ::eventfd(0, EFD_CLOEXEC);
    if (stopFd_ < 0) failSystem(rank_, "one-sided set-up: eventfd", errno);
    server_ = std::thread([this] { serveLinks(); });
  }
  BRAID_DEBUG(Init, "one-sided: %zu of %d peers through sockets", staged.size(), nranks_ - 1);
}

OneSided::~OneSided() {
  if (server_.joinable()) {
    const uint64_t one = 1;
    if (::write(stopFd_, &one, sizeof one) < 0) {
      // (an eventfd write cannot fail short of a full counter)
    }
    server_.join();
  }
  if (stopFd_ >= 0) ::close(stopFd_);
}

void OneSided::addWindow(uint64_t id, std::byte* base, size_t bytes) {
  struct Record {
    uint64_t base, bytes;
    uint64_t regionBase, regionBytes;
    int32_t regionFd;
    int32_t unused;
  };
  std::vector<Record> records(static_cast<size_t>(nranks_));
  const memory::Region region = memory::find(base);
  Record& mine = records[static_cast<size_t>(rank_)];
  mine = {reinterpret_cast<uint64_t>(base), bytes, 0, 0, -1, 0};
  if (region && region.contains(base, bytes))
    mine = {mine.base, bytes, reinterpret_cast<uint64_t>(region.base), region.bytes, region.fd, 0};
  // The window takes staged puts from the moment a peer can know of it:
  // before the all-gather returns anywhere. The rest only this thread reads.
  Window* window;
  {
    auto made = std::make_unique<Window>();
    made->base = base;
    made->bytes = bytes;
    window = made.get();
    std::lock_guard<std::mutex> lock(windowsMutex_);
    windows_[id] = std::move(made);
  }
  try {
    impl_.bootstrap->allGather(records.data(), sizeof(Record), deadlineAfter(impl_.timeout()));
  } catch (...) {
    std::lock_guard<std::mutex> lock(windowsMutex_);
    windows_.erase(id);
    throw;
  }

  std::lock_guard<std::mutex> lock(windowsMutex_);
  window->bytesOf.resize(static_cast<size_t>(nranks_));
  window->addressOf.resize(static_cast<size_t>(nranks_));
  window->at.assign(static_cast<size_t>(nranks_), nullptr);
  for (int peer = 0; peer < nranks_; ++peer) {
    const Record& theirs = records[static_cast<size_t>(peer)];
    window->bytesOf[static_cast<size_t>(peer)] = theirs.bytes;
    window->addressOf[static_cast<size_t>(peer)] = theirs.base;
    const Reach reach = reach_[static_cast<size_t>(peer)];
    if (reach == Reach::Local) {
      window->at[static_cast<size_t>(peer)] = reinterpret_cast<std::byte*>(theirs.base);
    } else if (reach == Reach::Near && theirs.regionFd >= 0) {
      void* mapped = mapFd(pids_[static_cast<size_t>(peer)], theirs.regionFd, theirs.regionBytes);
      if (!mapped) continue;  // process_vm_writev instead
      window->mappings.emplace_back(mapped, theirs.regionBytes);
      window->at[static_cast<size_t>(peer)] =
          static_cast<std::byte*>(mapped) + (theirs.base - theirs.regionBase);
    }
  }
}

void OneSided::removeWindow(uint64_t id) {
  // A fence on every staged pair follows this rank's puts; once this rank
  // has read every peer's, nothing more can land in the window.
  for (int peer = 0; peer < nranks_; ++peer)
    if (links_[static_cast<size_t>(peer)]) send(peer, kFenceFrame, kNoSignal, id, 0, nullptr, 0);
  const uint64_t want = ++removals_;  // every staged peer sends one fence per removal
  {
    std::unique_lock<std::mutex> lock(fenceMutex_);
    const net::Deadline deadline = deadlineAfter(impl_.timeout());
    for (int peer = 0; peer < nranks_; ++peer) {
      Link* link = links_[static_cast<size_t>(peer)].get();
      if (!link) continue;
      if (!fenced_.wait_until(lock, deadline, [&] { return link->fences >= want || link->closed; }))
        fail(ErrorCode::Timeout, rank_,
             format("deregisterWindow: rank %d's puts into window %llu did not all land within "
                    "the timeout",
                    peer, static_cast<unsigned long long>(id)));
      if (link->fences < want)
        fail(ErrorCode::RemoteError, rank_,
             format("deregisterWindow: rank %d closed its one-sided connection", peer));
    }
  }
  std::lock_guard<std::mutex> lock(windowsMutex_);
  windows_.erase(id);
}

void OneSided::addDeviceWindow(uint64_t id, std::byte* base, size_t bytes) {
  auto made = std::make_unique<Window>();
  made->base = base;
  made->bytes = bytes;
  made->onDevice = true;
  std::lock_guard<std::mutex> lock(windowsMutex_);
  windows_[id] = std::move(made);
}

const std::atomic<bool>* OneSided::linkClosed(int peer) const {
  const Link* link = links_[static_cast<size_t>(peer)].get();
  return link ? &link->closed : nullptr;
}

void OneSided::forgetWindow(uint64_t id) {
  std::lock_guard<std::mutex> lock(windowsMutex_);
  windows_.erase(id);
}

void OneSided::setDeviceRaise(std::function<void(int source, int signal)> raise) {
  std::lock_guard<std::mutex> lock(windowsMutex_);
  deviceRaise_ = std::move(raise);
}

void OneSided::putFromDevice(const void* source, size_t bytes, int peer, uint64_t window,
                             size_t offset, int signal) {
  Link& link = *links_[static_cast<size_t>(peer)];
  const Frame frame{kDevicePutFrame, signal < 0 ? kNoSignal : static_cast<uint32_t>(signal), window,
                    offset, bytes};
  const net::Deadline deadline = deadlineAfter(impl_.timeout());
  const std::string who = format("rank %d", peer);
  std::vector<std::byte> piece(std::min(bytes, kDevicePiece));
  std::lock_guard<std::mutex> lock(link.sendMutex);
  try {
    link.socket.sendAll(&frame, sizeof frame, deadline, who);
    for (size_t done = 0; done < bytes; done += piece.size()) {
      // The caller may free the source once its communicator failed.
      if (impl_.failed.load(std::memory_order_acquire))
        throw Error(ErrorCode::Aborted, "the communicator failed during the put");
      const size_t n = std::min(piece.size(), bytes - done);
      impl_.device->copyNow(piece.data(), static_cast<const std::byte*>(source) + done, n);
      link.socket.sendAll(piece.data(), n, deadline, who);
    }
  } catch (const Error& error) {
    fail(error.code(), rank_, format("one-sided call to rank %d: %s", peer, error.what()));
  }
}

void OneSided::signalOnDevice(int peer, int signal) {
  send(peer, kDeviceSignalFrame, static_cast<uint32_t>(signal), 0, 0, nullptr, 0);
}

void OneSided::landOnDevice(Link& link, const Window& window, uint64_t offset, uint64_t bytes,
                            net::Deadline deadline, const std::string& who) {
  landing_.resize(static_cast<size_t>(std::min<uint64_t>(bytes, kDevicePiece)));
  for (uint64_t done = 0; done < bytes; done += landing_.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(landing_.size(), bytes - done));
    link.socket.recvAll(landing_.data(), n, deadline, who);
    impl_.device->copyNow(window.base + offset + done, landing_.data(), n);
  }
}

bool OneSided::hasWindow(uint64_t id) const {
  std::lock_guard<std::mutex> lock(windowsMutex_);
  return windows_.count(id) != 0;
}

size_t OneSided::windowBytes(uint64_t id, int peer) const {
  std::lock_guard<std::mutex> lock(windowsMutex_);
  return windows_.at(id)->bytesOf[static_cast<size_t>(peer)];
}

// The counter's add comes first, and the sleepers are read after it: a
// wait counts itself a sleeper before it reads the counters (both in
// sequential order), so either it sees the add or this sees it.
void OneSided::ring(Board& board) {
  Board::Header& header = board.header();
  if (header.sleepers.load(std::memory_order_seq_cst) == 0) return;
  header.bell.fetch_add(1, std::memory_order_seq_cst);
  futex(&header.bell, FUTEX_WAKE, INT_MAX, nullptr);
}

void OneSided::raise(int peer, int signal) {
  Board& board = *boards_[static_cast<size_t>(peer)];
  counter(board, rank_, signal).fetch_add(1, std::memory_order_seq_cst);
  ring(board);
}

void OneSided::put(const void* source, size_t bytes, int peer, uint64_t window, size_t offset,
                   int signal) {
  const Reach reach = reach_[static_cast<size_t>(peer)];
  if (reach == Reach::Staged) {
    send(peer, kPutFrame, signal < 0 ? kNoSignal : static_cast<uint32_t>(signal), window, offset,
         source, bytes);
    return;
  }
  if (bytes > 0) {
    std::byte* at;
    uint64_t address;
    {
      std::lock_guard<std::mutex> lock(windowsMutex_);
      const Window& w = *windows_.at(window);
      at = w.at[static_cast<size_t>(peer)];
      address = w.addressOf[static_cast<size_t>(peer)];
    }
    if (at) {
      reduce::copy(at + offset, source, bytes);
    } else {
      iovec local{const_cast<void*>(source), bytes};
      iovec remote{reinterpret_cast<void*>(address + offset), bytes};
      while (local.iov_len > 0) {
        const ssize_t wrote =
            ::process_vm_writev(pids_[static_cast<size_t>(peer)], &local, 1, &remote, 1, 0);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote <= 0) {
          const int errnum = wrote < 0 ? errno : EIO;
          if (errnum == ESRCH)
            fail(ErrorCode::RemoteError, rank_,
                 format("put: rank %d's process is gone (pid %d)", peer,
                        pids_[static_cast<size_t>(peer)]));
          failSystem(rank_, format("put: writing into rank %d's window", peer), errnum);
        }
        const size_t n = static_cast<size_t>(wrote);
        local.iov_base = static_cast<std::byte*>(local.iov_base) + n;
        local.iov_len -= n;
        remote.iov_base = static_cast<std::byte*>(remote.iov_base) + n;
        remote.iov_len -= n;
      }
    }
  }
  if (signal >= 0) raise(peer, signal);
}

void OneSided::signal(int peer, int signal) {
  if (reach_[static_cast<size_t>(peer)] == Reach::Staged)
    send(peer, kSignalFrame, static_cast<uint32_t>(signal), 0, 0, nullptr, 0);
  else
    raise(peer, signal);
}

void OneSided::send(int peer, uint32_t kind, uint32_t signal, uint64_t window, uint64_t offset,
                    const void* bytes, size_t length) {
  Link& link = *links_[static_cast<size_t>(peer)];
  const Frame frame{kind, signal, window, offset, length};
  const net::Deadline deadline = deadlineAfter(impl_.timeout());
  const std::string who = format("rank %d", peer);
  std::lock_guard<std::mutex> lock(link.sendMutex);
  try {
    if (length <= kInlineBytes) {
      std::byte buffer[sizeof(Frame) + kInlineBytes];
      std::memcpy(buffer, &frame, sizeof frame);
      if (length > 0) std::memcpy(buffer + sizeof frame, bytes, length);
      link.socket.sendAll(buffer, sizeof frame + length, deadline, who);
    } else {
      link.socket.sendAll(&frame, sizeof frame, deadline, who);
      link.socket.sendAll(bytes, length, deadline, who);
    }
  } catch (const Error& error) {
    fail(error.code(), rank_, format("one-sided call to rank %d: %s", peer, error.what()));
  }
}

void OneSided::serveLinks() {
  std::vector<pollfd> fds;
  std::vector<int> peers;
  for (int peer = 0; peer < nranks_; ++peer) {
    if (!links_[static_cast<size_t>(peer)]) continue;
    fds.push_back({links_[static_cast<size_t>(peer)]->socket.fd(), POLLIN, 0});
    peers.push_back(peer);
  }
  fds.push_back({stopFd_, POLLIN, 0});
  for (;;) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      BRAID_WARN(Exec, "one-sided: poll: %s", std::strerror(errno));
      return;
    }
    if (fds.back().revents) return;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      Link& link = *links_[static_cast<size_t>(peers[i])];
      try {
        readFrame(peers[i]);
      } catch (const Error& error) {
        BRAID_DEBUG(Exec, "one-sided: rank %d's connection ended: %s", peers[i], error.what());
        {
          std::lock_guard<std::mutex> lock(fenceMutex_);
          link.closed = true;
        }
        fenced_.notify_all();
        ring(*own_);  // a wait for this peer sees it closed
        fds[i].fd = -1;
      }
    }
  }
}

void OneSided::readFrame(int peer) {
  Link& link = *links_[static_cast<size_t>(peer)];
  const std::string who = format("rank %d", peer);
  Frame frame;
  link.socket.recvAll(&frame, sizeof frame, deadlineAfter(impl_.timeout()), who);
  switch (frame.kind) {
    case kFenceFrame: {
      {
        std::lock_guard<std::mutex> lock(fenceMutex_);
        ++link.fences;
      }
      fenced_.notify_all();
      return;
    }
    case kPutFrame:
    case kDevicePutFrame: {
      const net::Deadline deadline = deadlineAfter(impl_.timeout());
      {
        std::lock_guard<std::mutex> lock(windowsMutex_);
        auto found = windows_.find(frame.window);
        const bool onDevice = frame.kind == kDevicePutFrame;
        if (found != windows_.end() && found->second->onDevice == onDevice &&
            frame.offset <= found->second->bytes &&
            frame.bytes <= found->second->bytes - frame.offset) {
          if (onDevice) {
            landOnDevice(link, *found->second, frame.offset, frame.bytes, deadline, who);
            if (frame.signal != kNoSignal && deviceRaise_)
              deviceRaise_(peer, static_cast<int>(frame.signal));
            return;
          }
          if (frame.bytes > 0)
            link.socket.recvAll(found->second->base + frame.offset, frame.bytes, deadline, who);
          break;
        }
      }
      // A sender checks its puts against this window: reaching here is a bug.
      BRAID_WARN(Exec, "one-sided: rank %d put %llu bytes at %llu outside window %llu; dropped",
                 peer, static_cast<unsigned long long>(frame.bytes),
                 static_cast<unsigned long long>(frame.offset),
                 static_cast<unsigned long long>(frame.window));
      std::byte sink[4096];
      for (uint64_t left = frame.bytes; left > 0;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left, sizeof sink));
        link.socket.recvAll(sink, n, deadline, who);
        left -= n;
      }
      return;
    }
    case kSignalFrame:
      break;
    case kDeviceSignalFrame: {
      std::lock_guard<std::mutex> lock(windowsMutex_);
      if (deviceRaise_ && frame.signal < static_cast<uint32_t>(kSignals))
        deviceRaise_(peer, static_cast<int>(frame.signal));
      return;
    }
    default:
      throw Error(ErrorCode::Internal, format("a frame of kind %u", frame.kind));
  }
  if (frame.signal == kNoSignal) return;
  if (frame.signal >= static_cast<uint32_t>(kSignals))
    throw Error(ErrorCode::Internal, format("a signal %u", frame.signal));
  counter(*own_, peer, static_cast<int>(frame.signal)).fetch_add(1, std::memory_order_seq_cst);
  ring(*own_);
}

void OneSided::wait(const SignalWait* waits, size_t count, net::Deadline deadline) {
  Board& board = *own_;
  auto met = [&] {
    for (size_t i = 0; i < count; ++i) {
      const uint64_t want =
          consumed_[static_cast<size_t>(waits[i].peer) * kSignals + waits[i].signal] +
          waits[i].count;
      if (counter(board, waits[i].peer, waits[i].signal).load(std::memory_order_seq_cst) < want)
        return false;
    }
    return true;
  };
  const auto spinUntil = std::chrono::steady_clock::now() + kSpin;
  while (!met()) {
    const auto now = std::chrono::steady_clock::now();
    if (now < spinUntil) {
      cpuRelax();
      continue;
    }
    impl_.throwIfFailed();
    for (size_t i = 0; i < count; ++i) {
      const Link* link = links_[static_cast<size_t>(waits[i].peer)].get();
      if (link && link->closed)
        fail(ErrorCode::RemoteError, rank_,
             format("waitSignals: rank %d closed its one-sided connection before signal %d "
                    "came",
                    waits[i].peer, waits[i].signal));
    }
    if (now >= deadline) {
      size_t first = 0;
      while (first < count) {
        const SignalWait& w = waits[first];
        if (counter(board, w.peer, w.signal).load() <
            consumed_[static_cast<size_t>(w.peer) * kSignals + w.signal] + w.count)
          break;
        ++first;
      }
      const SignalWait& w = waits[std::min(first, count - 1)];
      const uint64_t seen = counter(board, w.peer, w.signal).load() -
                            consumed_[static_cast<size_t>(w.peer) * kSignals + w.signal];
      fail(ErrorCode::Timeout, rank_,
           format("waitSignals: %llu of %llu signals %d from rank %d came within the timeout",
                  static_cast<unsigned long long>(seen), static_cast<unsigned long long>(w.count),
                  w.signal, w.peer));
    }
    Board::Header& header = board.header();
    header.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = header.bell.load(std::memory_order_seq_cst);
    if (!met()) {
      const auto slice =
          std::min<std::chrono::steady_clock::duration>(deadline - now, kLongestSleep);
      const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      const timespec timeout{static_cast<time_t>(nanos / 1000000000),
                             static_cast<long>(nanos % 1000000000)};
      futex(&header.bell, FUTEX_WAIT, seen, &timeout);
    }
    header.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  for (size_t i = 0; i < count; ++i)
    consumed_[static_cast<size_t>(waits[i].peer) * kSignals + waits[i].signal] += waits[i].count;
}

}  // namespace braid
