#include "transports/cuda_ipc/cuda_ipc_transport.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "bootstrap/agree.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/cuda_ipc/shared_blocks.h"
#include "transports/cuda_ipc/unix_channel.h"
#include "tuning/cost_model.h"

namespace braid::transport::cuda_ipc {
namespace {

// A block: the counters, each on a line of its own, then the slots from
// kSlotsOffset (aligned for 16-byte vector access and then some).
constexpr size_t kFilledOffset = 0;
constexpr size_t kCreditOffset = 128;
constexpr size_t kTagsOffset = 512;  // one word per slot (at most 64 slots)
constexpr size_t kSlotsOffset = 4096;

// The side channel's one message.
struct Notice {
  enum Kind : int32_t { Failure = 1, Goodbye = 2, WaitingFor = 3 };
  int32_t kind;
  int32_t failedRank;
  int32_t reason;  // Failure: a GiveUpReason
};

// What each rank tells the others at set-up. Device numbers mean nothing
// across processes (CUDA_VISIBLE_DEVICES renumbers), so GPUs are named by
// UUID: the rank's own, and those its process sees (the first kSeen).
constexpr int kSeen = 16;
struct Advert {
  char listener[64];
  uint64_t process;    // processToken()
  int32_t device;      // in its process: meaningful to ranks of the same process
  int32_t exportable;  // 1: its device memory can be exported (Properties::fdHandles)
  int32_t seenCount;
  std::array<uint8_t, 16> uuid;  // its GPU's
  std::array<uint8_t, 16> seen[kSeen];

  bool sees(const std::array<uint8_t, 16>& gpu) const {
    for (int i = 0; i < seenCount && i < kSeen; ++i)
      if (seen[i] == gpu) return true;
    return false;
  }
};

// How rank `mine` reaches another process's rank `theirs` (both on this
// host), decided alike on both sides from the two adverts: the same GPU, or
// two GPUs each process sees with peer access between them (asked of this
// process's device, as peer access goes both ways), and in both cases
// memory both can export; else FIFOs staged through host memory.
struct PairReach {
  bool sameGpu = false;
  bool staged = true;
};
PairReach reachOf(const device::Device& device, const Advert& mine, const Advert& theirs) {
  PairReach reach;
  reach.sameGpu = mine.uuid == theirs.uuid;
  bool mapped = reach.sameGpu;
  if (!mapped && mine.sees(theirs.uuid) && theirs.sees(mine.uuid)) {
    const int peer = device.deviceWithUuid(theirs.uuid);
    mapped = peer >= 0 && device.canAccessPeer(mine.device, peer);
  }
  reach.staged = !mapped || mine.exportable == 0 || theirs.exportable == 0;
  return reach;
}

// What a pair exchanges with the descriptor of its block.
struct BlockInfo {
  uint64_t bytes;
  int32_t device;
  int32_t host;  // 1: staging memory in host memory (allocateHost)
};

uint32_t* counterAt(std::byte* block, size_t offset) {
  return reinterpret_cast<uint32_t*>(block + offset);
}

template <typename Phase>
void agree(bootstrap::Bootstrap& bootstrap, net::Deadline deadline, const char* doing,
           Phase&& phase) {
  bootstrap::agree(bootstrap, deadline, "cuda_ipc", doing, std::forward<Phase>(phase));
}

std::string who(int rank) { return format("rank %d", rank); }

constexpr const char* kSettingUp = "set up device connections";

class CudaIpcTransport final : public DeviceTransport {
 public:
  CudaIpcTransport(device::Device& device, int rank, int nranks, size_t slotBytes, int slots)
      : device_(device),
        rank_(rank),
        slotBytes_(slotBytes),
        slots_(slots),
        peers_(static_cast<size_t>(nranks)) {}

  ~CudaIpcTransport() override {
    for (size_t r = 0; r < peers_.size(); ++r) {
      Peer& peer = peers_[r];
      if (peer.inProcess) {  // the blocks go with their last reference
        withdraw(job_, rank_, static_cast<int>(r));
        continue;
      }
      try {
        if (peer.remote && peer.remote != peer.local) device_.unimport(peer.remote, blockBytes());
        if (peer.local) device_.free(peer.local);
      } catch (const Error& error) {  // a broken device: nothing more to do about it
        BRAID_WARN(Exec, "cuda_ipc: freeing a FIFO block failed: %s", error.what());
      }
    }
  }

  // After a broken device was abandoned, streams may still use the blocks:
  // they stay mapped (leaked) rather than pulled from under them.
  void keepMemory() override {
    for (Peer& peer : peers_) {
      if (peer.localBlock) peer.localBlock->leak();
      if (peer.remoteBlock) peer.remoteBlock->leak();
      peer.local = peer.remote = nullptr;
    }
  }

  size_t slotBytes() const override { return slotBytes_; }
  int slots() const override { return slots_; }
  size_t deviceBytes() const override {
    size_t bytes = 0;  // each peer's block this rank made (staged ones are host memory)
    for (const Peer& peer : peers_)
      if (peer.local && !peer.staged) bytes += blockBytes();
    return bytes;
  }
  size_t blockBytes() const { return kSlotsOffset + slotBytes_ * static_cast<size_t>(slots_); }

  DeviceConnection* connection(int peer) override {
    Peer& p = peers_[static_cast<size_t>(peer)];
    return p.local ? &p.connection : nullptr;
  }

  std::string path(int peer) const override {
    const Peer& p = peers_[static_cast<size_t>(peer)];
    if (!p.local) return "none";
    if (peer == rank_) return "self";
    const char* how = p.staged || p.remoteStaged ? "staged through host memory"
                      : p.sameGpu                ? "same device"
                                                 : "peer access";
    return std::string(p.inProcess ? "nvlink_p2p: " : "cuda_ipc: ") + how;
  }

  // Each phase ends with every rank saying whether it went well, so that
  // all ranks fail together (naming the rank and what went wrong) instead
  // of some waiting for the others until the deadline.
  void setUp(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers, int deviceIndex,
             net::Deadline deadline) {
    job_ = bootstrap.secret();
    const int nranks = bootstrap.size();
    std::vector<bool> served(static_cast<size_t>(nranks), false);
    for (int peer : peers) served[static_cast<size_t>(peer)] = true;
    auto local = [&](int r) { return served[static_cast<size_t>(r)]; };

    std::optional<UnixListener> listening;
    agree(bootstrap, deadline, kSettingUp, [&] { listening.emplace(); });
    UnixListener& listener = *listening;
    std::vector<Advert> adverts(static_cast<size_t>(nranks));
    Advert& mine = adverts[rank_];
    std::memset(&mine, 0, sizeof(mine));
    std::snprintf(mine.listener, sizeof(mine.listener), "%s", listener.name().c_str());
    mine.process = processToken();
    mine.device = deviceIndex;
    mine.exportable = device_.properties(deviceIndex).fdHandles ? 1 : 0;
    mine.uuid = device_.properties(deviceIndex).uuid;
    mine.seenCount = std::min(device_.count(), kSeen);
    for (int d = 0; d < mine.seenCount; ++d) mine.seen[d] = device_.properties(d).uuid;
    bootstrap.allGather(adverts.data(), sizeof(Advert), deadline);
    for (int r = 0; r < nranks; ++r)
      peers_[r].inProcess = r != rank_ && local(r) && adverts[r].process == mine.process;

    // Memory, and a connection to every higher rank (a connect and its
    // hello never wait for the accept).
    agree(bootstrap, deadline, kSettingUp, [&] {
      for (int r = 0; r < nranks; ++r) {
        if (!local(r)) continue;
        Peer& peer = peers_[r];
        // Without peer access between the two devices, or memory that
        // cannot be exported, this rank's block for the peer is page-locked
        // host memory that both reach.
        if (r == rank_) {
          peer.sameGpu = true;
          peer.staged = false;
        } else if (peer.inProcess) {  // device numbers of one process
          peer.sameGpu = adverts[r].device == deviceIndex;
          peer.staged = !device_.canAccessPeer(deviceIndex, adverts[r].device);
        } else {
          const PairReach reach = reachOf(device_, mine, adverts[r]);
          peer.sameGpu = reach.sameGpu;
          peer.staged = reach.staged;
        }
        peer.local =
            static_cast<std::byte*>(peer.staged ? device_.allocateHost(blockBytes())
                                                : device_.allocate(deviceIndex, blockBytes()));
        if (peer.inProcess) {  // nvlink_p2p: the peer takes the pointer itself
          peer.localBlock = std::make_shared<Block>(device_, peer.local, peer.staged);
          publish(job_, rank_, r, peer.localBlock);
        }
      }
      for (int r = rank_ + 1; r < nranks; ++r)
        if (local(r)) {
          adverts[r].listener[sizeof(adverts[r].listener) - 1] = '\0';
          peers_[r].channel =
              connectUnix(adverts[r].listener, bootstrap.secret(), rank_, deadline, who(r));
        }
    });
    // Every lower rank connected: accept them, then swap the blocks'
    // descriptors (all sends first: small, they never block).
    agree(bootstrap, deadline, kSettingUp, [&] {
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
      for (int r = 0; r < nranks; ++r) {
        Peer& peer = peers_[r];
        if (!peer.channel.valid() || peer.inProcess) continue;
        const int fd = device_.exportFd(peer.local);
        const BlockInfo info{blockBytes(), deviceIndex, peer.staged ? 1 : 0};
        try {
          sendWithFd(peer.channel, &info, sizeof(info), fd, deadline, who(r));
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
      }
    });
    agree(bootstrap, deadline, kSettingUp, [&] {
      for (int r = 0; r < nranks; ++r) {
        Peer& peer = peers_[r];
        if (r == rank_ && peer.local) peer.remote = peer.local;
        if (peer.inProcess) {
          peer.remoteBlock = take(job_, r, rank_);
          peer.remote = peer.remoteBlock->base();
          peer.remoteStaged = peer.remoteBlock->host();
          continue;
        }
        if (!peer.channel.valid()) continue;
        BlockInfo info{};
        const int fd = recvWithFd(peer.channel, &info, sizeof(info), deadline, who(r));
        if (info.bytes != blockBytes()) {
          ::close(fd);
          throw Error(ErrorCode::InvalidArgument,
                      format("rank %d's FIFO block is %llu bytes, this rank's %zu: "
                             "BRAID_DEVICE_SLOT_BYTES and BRAID_DEVICE_SLOTS must be the same on "
                             "every rank",
                             r, static_cast<unsigned long long>(info.bytes), blockBytes()));
        }
        try {
          peer.remoteStaged = info.host != 0;
          peer.remote = static_cast<std::byte*>(
              peer.remoteStaged ? device_.importHost(fd, blockBytes())
                                : device_.import(fd, blockBytes(), deviceIndex));
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
      }
    });
    // (After the last agreement every peer has mapped this rank's blocks,
    // so nobody writes into a block its owner has not handed out.)
    for (int r = 0; r < nranks; ++r) {
      Peer& peer = peers_[r];
      if (!peer.local) continue;
      DeviceConnection& c = peer.connection;
      c.peer = r;
      c.recv.slots = peer.local + kSlotsOffset;
      c.recv.tags = counterAt(peer.local, kTagsOffset);
      c.send.tags = counterAt(peer.remote, kTagsOffset);
      c.recv.filled = counterAt(peer.local, kFilledOffset);
      c.recv.credit = counterAt(peer.remote, kCreditOffset);
      c.send.slots = peer.remote + kSlotsOffset;
      c.send.filled = counterAt(peer.remote, kFilledOffset);
      c.send.credit = counterAt(peer.local, kCreditOffset);
    }
  }

  void poll(std::vector<PeerNotice>* notices) override {
    fds_.clear();
    owners_.clear();
    for (size_t r = 0; r < peers_.size(); ++r)
      if (peers_[r].channel.valid() && !peers_[r].reported) {
        fds_.push_back({peers_[r].channel.fd(), POLLIN, 0});
        owners_.push_back(static_cast<int>(r));
      }
    if (fds_.empty() || ::poll(fds_.data(), fds_.size(), 0) <= 0) return;
    for (size_t i = 0; i < fds_.size(); ++i)
      if (fds_[i].revents != 0) readNotices(owners_[i], notices);
  }

  void announceFailure(int failedRank, GiveUpReason reason) override {
    tell({Notice::Failure, failedRank, static_cast<int32_t>(reason)});
  }
  void sayGoodbye() override { tell({Notice::Goodbye, -1, 0}); }
  void announceWaitingFor(int rank) override { tell({Notice::WaitingFor, rank, 0}); }
  int peerWaitsFor(int peer) const override { return peers_[static_cast<size_t>(peer)].waitsFor; }

 private:
  struct Peer {
    std::byte* local = nullptr;   // this rank's block for the peer
    std::byte* remote = nullptr;  // the peer's block for this rank, mapped
    // A peer in this process (nvlink_p2p): both blocks are plain pointers,
    // owned jointly with the peer instead of freed and unmapped here.
    bool inProcess = false;
    BlockRef localBlock, remoteBlock;
    bool sameGpu = false;       // the peer's GPU is this rank's
    bool staged = false;        // `local` is host memory (no peer access between the devices)
    bool remoteStaged = false;  // so is `remote`
    net::Socket channel;        // none for this rank itself and peers not served
    DeviceConnection connection;
    bool reported = false;  // its closing was reported by poll()
    bool goodbye = false;
    int failedRank = -1;
    GiveUpReason reason = GiveUpReason::Failed;
    int waitsFor = -1;                  // what the peer last said it waits for
    std::byte partial[sizeof(Notice)];  // a notice still arriving
    size_t have = 0;
  };

  // Takes in what `peer` sent: whole notices, and its close.
  void readNotices(int rank, std::vector<PeerNotice>* notices) {
    Peer& peer = peers_[static_cast<size_t>(rank)];
    for (;;) {
      const ssize_t got = ::recv(peer.channel.fd(), peer.partial + peer.have,
                                 sizeof(Notice) - peer.have, MSG_DONTWAIT);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (got <= 0) {  // closed (or reset): reported once, with what it said before
        peer.reported = true;
        notices->push_back({rank, -1, true, peer.goodbye, false, -1});
        return;
      }
      peer.have += static_cast<size_t>(got);
      if (peer.have < sizeof(Notice)) continue;
      peer.have = 0;
      Notice said;
      std::memcpy(&said, peer.partial, sizeof(said));
      if (said.kind == Notice::Goodbye) {
        peer.goodbye = true;
      } else if (said.kind == Notice::WaitingFor) {
        peer.waitsFor = said.failedRank;
        notices->push_back({rank, peer.waitsFor, false, false, false, -1});
      } else if (said.kind == Notice::Failure) {
        // Reported as a close: the peer sends nothing more that matters.
        peer.failedRank = said.failedRank;
        peer.reason = static_cast<GiveUpReason>(said.reason);
        peer.reported = true;
        notices->push_back({rank, -1, true, false, true, peer.failedRank, peer.reason});
        return;
      }
    }
  }

  // A notice, whole: a peer trusts this rank's released streams only
  // after it heard that this rank gave up. Waits at most kNoticeWait for
  // room; a channel that takes none is shut, so the peer sees it close.
  void sendNotice(Peer& peer, const Notice& notice) {
    const auto* bytes = reinterpret_cast<const char*>(&notice);
    size_t sent = 0;
    const auto deadline = net::Clock::now() + kNoticeWait;
    while (sent < sizeof(notice)) {
      const ssize_t n = ::send(peer.channel.fd(), bytes + sent, sizeof(notice) - sent,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      pollfd p{peer.channel.fd(), POLLOUT, 0};
      if (n < 0 && errno == EAGAIN && ::poll(&p, 1, net::millisecondsUntil(deadline)) > 0) continue;
      ::shutdown(peer.channel.fd(), SHUT_RDWR);
      return;
    }
  }
  static constexpr auto kNoticeWait = std::chrono::milliseconds(200);

  void tell(const Notice& notice) {
    for (Peer& peer : peers_)
      if (peer.channel.valid()) sendNotice(peer, notice);
  }

  device::Device& device_;
  const int rank_;
  uint64_t job_ = 0;  // the bootstrap's secret: names this job's blocks in shared_blocks.h's table
  const size_t slotBytes_;
  const int slots_;
  std::vector<Peer> peers_;
  std::vector<pollfd> fds_;  // poll()'s scratch, kept to avoid allocating
  std::vector<int> owners_;
};

std::unique_ptr<DeviceTransport> create(const Setup& setup, const std::vector<int>& peers,
                                        std::string*) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  auto transport = std::make_unique<CudaIpcTransport>(
      *setup.device, bootstrap.rank(), bootstrap.size(), setup.slotBytes, setup.slots);
  transport->setUp(bootstrap, peers, setup.deviceIndex, setup.deadline);
  return transport;
}

void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes) {
  for (const PeerWindow& window : windows)
    if (window.imported) device.unimport(window.base, bytes);
}

std::vector<PeerWindow> mapWindow(const Setup& setup, const std::vector<int>& peers, void* base,
                                  size_t bytes) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  device::Device& device = *setup.device;
  const int deviceIndex = setup.deviceIndex;
  const net::Deadline deadline = setup.deadline;
  const int nranks = bootstrap.size(), rank = bootstrap.rank();
  std::vector<bool> served(static_cast<size_t>(nranks), false);
  for (int peer : peers) served[static_cast<size_t>(peer)] = true;
  struct Offer {
    char listener[64];
    uint64_t process;
    uint64_t base;  // (meaningful to ranks of this process)
    uint64_t bytes;
  };
  constexpr const char* kMapping = "map a window";
  std::optional<UnixListener> listening;
  agree(bootstrap, deadline, kMapping, [&] { listening.emplace(); });
  std::vector<Offer> offers(static_cast<size_t>(nranks));
  Offer& mine = offers[rank];
  std::memset(&mine, 0, sizeof(mine));
  std::snprintf(mine.listener, sizeof(mine.listener), "%s", listening->name().c_str());
  mine.process = processToken();
  mine.base = reinterpret_cast<uintptr_t>(base);
  mine.bytes = bytes;
  bootstrap.allGather(offers.data(), sizeof(Offer), deadline);
  // Ranks of another process on this host: they need a descriptor.
  auto viaIpc = [&](int r) {
    return r != rank && served[static_cast<size_t>(r)] && offers[r].process != mine.process;
  };
  std::vector<PeerWindow> windows(static_cast<size_t>(nranks));
  std::vector<net::Socket> channels(static_cast<size_t>(nranks));
  agree(bootstrap, deadline, kMapping, [&] {
    for (int r = 0; r < nranks; ++r)
      if (offers[r].bytes != bytes)
        throw Error(ErrorCode::InvalidArgument,
                    format("its window is %zu bytes and rank %d's %llu: every rank registers the "
                           "same size",
                           bytes, r, static_cast<unsigned long long>(offers[r].bytes)));
    for (int r = rank + 1; r < nranks; ++r)
      if (viaIpc(r)) {
        offers[r].listener[sizeof(offers[r].listener) - 1] = '\0';
        channels[r] = connectUnix(offers[r].listener, bootstrap.secret(), rank, deadline, who(r));
      }
  });
  agree(bootstrap, deadline, kMapping, [&] {
    int lower = 0;
    for (int r = 0; r < rank; ++r) lower += viaIpc(r) ? 1 : 0;
    for (int accepted = 0; accepted < lower;) {
      int from = -1;
      net::Socket socket = listening->accept(bootstrap.secret(), &from, deadline);
      if (from < 0 || from >= rank || !viaIpc(from) || channels[from].valid()) {
        BRAID_WARN(Init, "cuda_ipc: dropped a connection that claims to be rank %d", from);
        continue;
      }
      channels[from] = std::move(socket);
      ++accepted;
    }
    bool anyIpc = false;
    for (int r = 0; r < nranks; ++r) anyIpc |= channels[r].valid();
    if (!anyIpc) return;
    const int fd = device.exportFd(base);  // throws for memory braid did not allocate
    try {
      for (int r = 0; r < nranks; ++r)
        if (channels[r].valid())
          sendWithFd(channels[r], &mine.bytes, sizeof(mine.bytes), fd, deadline, who(r));
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  });
  try {
    agree(bootstrap, deadline, kMapping, [&] {
      for (int r = 0; r < nranks; ++r) {
        if (r == rank || (served[static_cast<size_t>(r)] && !viaIpc(r))) {
          windows[r].base = reinterpret_cast<std::byte*>(static_cast<uintptr_t>(offers[r].base));
          continue;
        }
        if (!channels[r].valid()) continue;
        uint64_t size = 0;
        const int fd = recvWithFd(channels[r], &size, sizeof(size), deadline, who(r));
        try {
          windows[r].base = static_cast<std::byte*>(device.import(fd, bytes, deviceIndex));
          windows[r].imported = true;
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
      }
    });
  } catch (...) {
    unmapWindow(device, windows, bytes);
    throw;
  }
  return windows;
}

}  // namespace

TransportEntry entry() {
  TransportEntry entry(
      "cuda_ipc", Reach::SameHost,
      "device memory FIFOs mapped between the ranks of one host (cuMem fd handles), "
      "or handed over as pointers within a process (nvlink_p2p)");
  entry.createDevice = create;
  entry.mapWindow = mapWindow;
  entry.unmapWindow = unmapWindow;
  // A piece costs a few stream operations (a flag wait, a kernel, a flag
  // write: microseconds each); HBM and NVLink move hundreds of GB/s.
  entry.deviceLink = tuning::deviceLinkModel(8e-6, 150e9);
  return entry;
}

}  // namespace braid::transport::cuda_ipc
