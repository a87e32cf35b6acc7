#include "transports/cuda_ipc/cuda_ipc_transport.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/cuda_ipc/unix_channel.h"

namespace braid::transport::cuda_ipc {
namespace {

// A block: the counters, each on a line of its own, then the slots from
// kSlotsOffset (aligned for 16-byte vector access and then some).
constexpr size_t kFilledOffset = 0;
constexpr size_t kCreditOffset = 128;
constexpr size_t kSlotsOffset = 4096;

// The side channel's one message.
struct Notice {
  enum Kind : int32_t { Failure = 1, Goodbye = 2, WaitingFor = 3 };
  int32_t kind;
  int32_t failedRank;
  int32_t timedOut;
};

// What each rank tells the others at set-up.
struct Advert {
  char listener[64];
  int32_t device;
};

// What a pair exchanges with the descriptor of its block.
struct BlockInfo {
  uint64_t bytes;
  int32_t device;
  int32_t pad;
};

uint32_t* counterAt(std::byte* block, size_t offset) {
  return reinterpret_cast<uint32_t*>(block + offset);
}

class CudaIpcTransport final : public DeviceTransport {
 public:
  CudaIpcTransport(device::Device& device, int rank, int nranks, size_t slotBytes, int slots)
      : device_(device),
        rank_(rank),
        slotBytes_(slotBytes),
        slots_(slots),
        peers_(static_cast<size_t>(nranks)) {}

  ~CudaIpcTransport() override {
    for (Peer& peer : peers_) {
      if (peer.remote && peer.remote != peer.local) device_.unimport(peer.remote, blockBytes());
      if (peer.local) device_.free(peer.local);
    }
  }

  const char* name() const override { return "cuda_ipc"; }
  size_t slotBytes() const override { return slotBytes_; }
  int slots() const override { return slots_; }
  size_t blockBytes() const { return kSlotsOffset + slotBytes_ * static_cast<size_t>(slots_); }

  DeviceConnection* connection(int peer) override {
    Peer& p = peers_[static_cast<size_t>(peer)];
    return p.local ? &p.connection : nullptr;
  }

  const char* path(int peer) const override {
    const Peer& p = peers_[static_cast<size_t>(peer)];
    if (!p.local) return "none (another host)";
    if (peer == rank_) return "self";
    return p.device == myDevice_ ? "same device" : "peer access";
  }

  void setUp(bootstrap::Bootstrap& bootstrap, int deviceIndex, net::Deadline deadline) {
    myDevice_ = deviceIndex;
    const int nranks = bootstrap.size();
    const std::string& host = bootstrap.table()[rank_].hostId;
    auto local = [&](int r) { return bootstrap.table()[r].hostId == host; };

    UnixListener listener;
    std::vector<Advert> adverts(static_cast<size_t>(nranks));
    Advert& mine = adverts[rank_];
    std::memset(&mine, 0, sizeof(mine));
    std::snprintf(mine.listener, sizeof(mine.listener), "%s", listener.name().c_str());
    mine.device = deviceIndex;
    bootstrap.allGather(adverts.data(), sizeof(Advert), deadline);

    for (int r = 0; r < nranks; ++r) {
      if (!local(r)) continue;
      Peer& peer = peers_[r];
      peer.device = adverts[r].device;
      if (r != rank_ && !device_.canAccessPeer(deviceIndex, peer.device))
        fail(ErrorCode::InvalidUsage, rank_,
             format("cuda_ipc: device %d of this rank cannot reach device %d of rank %d (no peer "
                    "access between them; staging through host memory is not supported yet)",
                    deviceIndex, peer.device, r));
      peer.local = static_cast<std::byte*>(device_.allocate(deviceIndex, blockBytes()));
    }
    // Lower ranks connect to higher ones (a connect and its hello never
    // wait for the accept), then each accepts the lower ones.
    for (int r = rank_ + 1; r < nranks; ++r)
      if (local(r)) {
        adverts[r].listener[sizeof(adverts[r].listener) - 1] = '\0';
        peers_[r].channel =
            connectUnix(adverts[r].listener, bootstrap.secret(), rank_, deadline, who(r));
      }
    int lower = 0;
    for (int r = 0; r < rank_; ++r) lower += local(r) ? 1 : 0;
    for (int accepted = 0; accepted < lower;) {
      int from = -1;
      net::Socket socket = listener.accept(bootstrap.secret(), &from, deadline);
      if (from < 0 || from >= rank_ || !local(from) || peers_[from].channel.valid()) {
        BRAID_WARN(Init, "cuda_ipc: dropped a connection that claims to be rank %d", from);
        continue;
      }
      peers_[from].channel = std::move(socket);
      ++accepted;
    }
    // Every pair swaps its blocks' descriptors: all sends first (small,
    // they never block), then every receive.
    for (int r = 0; r < nranks; ++r) {
      Peer& peer = peers_[r];
      if (!peer.channel.valid()) continue;
      const int fd = device_.exportFd(peer.local);
      const BlockInfo info{blockBytes(), deviceIndex, 0};
      try {
        sendWithFd(peer.channel, &info, sizeof(info), fd, deadline, who(r));
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    for (int r = 0; r < nranks; ++r) {
      Peer& peer = peers_[r];
      if (r == rank_ && peer.local) peer.remote = peer.local;
      if (!peer.channel.valid()) continue;
      BlockInfo info{};
      const int fd = recvWithFd(peer.channel, &info, sizeof(info), deadline, who(r));
      if (info.bytes != blockBytes()) {
        ::close(fd);
        fail(ErrorCode::InvalidArgument, rank_,
             format("cuda_ipc: rank %d's FIFO block is %llu bytes, this rank's %zu: "
                    "BRAID_DEVICE_SLOT_BYTES and BRAID_DEVICE_SLOTS must be the same on every rank",
                    r, static_cast<unsigned long long>(info.bytes), blockBytes()));
      }
      try {
        peer.remote = static_cast<std::byte*>(device_.import(fd, blockBytes(), deviceIndex));
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    for (int r = 0; r < nranks; ++r) {
      Peer& peer = peers_[r];
      if (!peer.local) continue;
      DeviceConnection& c = peer.connection;
      c.peer = r;
      c.recv.slots = peer.local + kSlotsOffset;
      c.recv.filled = counterAt(peer.local, kFilledOffset);
      c.recv.credit = counterAt(peer.remote, kCreditOffset);
      c.send.slots = peer.remote + kSlotsOffset;
      c.send.filled = counterAt(peer.remote, kFilledOffset);
      c.send.credit = counterAt(peer.local, kCreditOffset);
    }
    // Nobody writes into a peer's block before the peer mapped ours.
    bootstrap.barrier(deadline);
  }

  bool poll(PeerNotice* notice, std::chrono::milliseconds wait) override {
    fds_.clear();
    owners_.clear();
    for (size_t r = 0; r < peers_.size(); ++r)
      if (peers_[r].channel.valid() && !peers_[r].reported) {
        fds_.push_back({peers_[r].channel.fd(), POLLIN, 0});
        owners_.push_back(static_cast<int>(r));
      }
    if (fds_.empty()) {
      if (wait.count() > 0) ::usleep(static_cast<useconds_t>(wait.count()) * 1000);
      return false;
    }
    const int ready = ::poll(fds_.data(), fds_.size(), static_cast<int>(wait.count()));
    if (ready <= 0) return false;
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (fds_[i].revents == 0) continue;
      Peer& peer = peers_[owners_[i]];
      Notice said{};
      const ssize_t got = ::recv(fds_[i].fd, &said, sizeof(said), MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got == static_cast<ssize_t>(sizeof(said)) && said.kind == Notice::Goodbye) {
        peer.goodbye = true;
        continue;  // the close that follows is reported, as a clean one
      }
      if (got == static_cast<ssize_t>(sizeof(said)) && said.kind == Notice::WaitingFor) {
        peer.waitsFor = said.failedRank;
        *notice = {owners_[i], peer.waitsFor, false, false, -1, false};
        return true;
      }
      if (got == static_cast<ssize_t>(sizeof(said)) && said.kind == Notice::Failure) {
        peer.failedRank = said.failedRank;
        peer.timedOut = said.timedOut != 0;
      }
      peer.reported = true;
      *notice = {owners_[i], -1, true, peer.goodbye, peer.failedRank, peer.timedOut};
      return true;
    }
    return false;
  }

  void announceFailure(int failedRank, bool timedOut) override {
    tell({Notice::Failure, failedRank, timedOut ? 1 : 0});
  }
  void sayGoodbye() override { tell({Notice::Goodbye, -1, 0}); }
  void announceWaitingFor(int rank) override { tell({Notice::WaitingFor, rank, 0}); }
  int peerWaitsFor(int peer) const override { return peers_[static_cast<size_t>(peer)].waitsFor; }

 private:
  struct Peer {
    std::byte* local = nullptr;   // this rank's block for the peer
    std::byte* remote = nullptr;  // the peer's block for this rank, mapped
    int device = -1;
    net::Socket channel;  // none for this rank itself and other hosts
    DeviceConnection connection;
    bool reported = false;  // its closing was reported by poll()
    bool goodbye = false;
    int failedRank = -1;
    bool timedOut = false;
    int waitsFor = -1;  // what the peer last said it waits for
  };

  static std::string who(int rank) { return format("rank %d", rank); }

  // Best effort: a full or closed socket just drops the notice.
  void tell(const Notice& notice) {
    for (Peer& peer : peers_)
      if (peer.channel.valid())
        (void)::send(peer.channel.fd(), &notice, sizeof(notice), MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  device::Device& device_;
  const int rank_;
  const size_t slotBytes_;
  const int slots_;
  int myDevice_ = -1;
  std::vector<Peer> peers_;
  std::vector<pollfd> fds_;  // poll()'s scratch, kept to avoid allocating
  std::vector<int> owners_;
};

}  // namespace

std::unique_ptr<DeviceTransport> create(bootstrap::Bootstrap& bootstrap, device::Device& device,
                                        int deviceIndex, size_t slotBytes, int slots,
                                        net::Deadline deadline) {
  auto transport = std::make_unique<CudaIpcTransport>(device, bootstrap.rank(), bootstrap.size(),
                                                      slotBytes, slots);
  transport->setUp(bootstrap, deviceIndex, deadline);
  return transport;
}

}  // namespace braid::transport::cuda_ipc
