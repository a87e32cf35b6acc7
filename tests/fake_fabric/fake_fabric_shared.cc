// The fake fabric's shared memory (fake_fabric_shared.h).
#include "tests/fake_fabric/fake_fabric_shared.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/errors.h"

namespace braid::transport::ibverbs::fake_fabric {

constexpr auto kStalledSlot = std::chrono::milliseconds(10);

// ------------------------------------------------------------ system bits

void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
void futexWait(std::atomic<uint32_t>* word, uint32_t value, Clock::duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::min<Clock::duration>(timeout, std::chrono::hours(1)))
                      .count();
  timespec relative{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // Not FUTEX_PRIVATE: producers in other processes wake it.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, value, &relative, nullptr, 0);
}

int pidfdOpen(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
// A pidfd turns readable when its process has exited, zombie or reaped;
// kill(pid, 0) would still find a zombie, so it is only the fallback.
bool processGone(int pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return kill(pid, 0) == -1 && errno == ESRCH;
}
bool processGone(int pid) {
  const int fd = pidfdOpen(pid);
  if (fd < 0) return errno == ESRCH || processGone(pid, -1);
  const bool gone = processGone(pid, fd);
  close(fd);
  return gone;
}

uint64_t newId() {
  static std::atomic<uint64_t> ids{0};  // a forked child goes on counting, under its own pid
  return uint64_t(static_cast<uint32_t>(getpid())) << 32 | (ids.fetch_add(1) + 1);
}

// ------------------------------------------------------------ GIDs

Gid makeGid(int index, int pid) {
  Gid gid;
  auto& r = gid.raw;
  if (index == 0) {
    r[0] = 0xfe, r[1] = 0x80, r[11] = 0xff, r[12] = 0xfe;
  } else if (index == 1) {
    r[10] = 0xff, r[11] = 0xff, r[12] = 10;
  } else {
    return gid;  // unused entries read as zero, as on hardware
  }
  r[13] = static_cast<uint8_t>(pid >> 16), r[14] = static_cast<uint8_t>(pid >> 8);
  r[15] = static_cast<uint8_t>(pid);
  return gid;
}
int pidOfGid(const Gid& gid) {
  const int pid = gid.raw[13] << 16 | gid.raw[14] << 8 | gid.raw[15];
  return pid > 0 && (gid == makeGid(0, pid) || gid == makeGid(1, pid)) ? pid : -1;
}
std::string gidText(const Gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2)
    out += format(i ? ":%02x%02x" : "%02x%02x", gid.raw[i], gid.raw[i + 1]);
  return out;
}

// ------------------------------------------------------------ CQ rings

namespace {

void wake(CqShared* cq) {
  cq->futexWord.fetch_add(1, std::memory_order_seq_cst);
  if (cq->waiters.load(std::memory_order_seq_cst) != 0) futexWake(&cq->futexWord);
}

}  // namespace

bool push(CqShared* cq, CqSlot* slots, const Entry& e, uint32_t pid) {
  const uint64_t capacity = cq->capacity.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t t = cq->tail.load(std::memory_order_acquire);
    CqSlot& s = slots[t & (capacity - 1)];
    uint64_t word = s.word.load(std::memory_order_acquire);
    if (ticketOf(word) == (t & kTicketMask)) {
      if (stateOf(word) == kFree) {
        if (!s.word.compare_exchange_strong(word, slotWord(t, pid, kClaimed),
                                            std::memory_order_acq_rel)) {
          continue;
        }
        uint64_t expected = t;
        cq->tail.compare_exchange_strong(expected, t + 1, std::memory_order_acq_rel);
        s.wrId = e.wrId, s.sqIndex = e.sqIndex, s.status = static_cast<uint32_t>(e.status);
        s.opcode = static_cast<uint32_t>(e.opcode), s.bytes = e.bytes, s.imm = e.imm;
        s.qpNum = e.qpNum, s.qpSlot = e.qpSlot, s.recv = e.recv;
        s.word.store(slotWord(t, 0, kPublished), std::memory_order_release);
        wake(cq);
        return true;
      }
      cq->tail.compare_exchange_strong(t, t + 1, std::memory_order_acq_rel);  // help its claimer
    } else if (((t - ticketOf(word)) & kTicketMask) == capacity &&
               cq->tail.load(std::memory_order_acquire) == t) {
      cq->overrun.store(1, std::memory_order_release);
      wake(cq);
      return false;
    }
  }
}

CqRing::CqRing(uint8_t* at, uint64_t capacity)
    : shared_(reinterpret_cast<CqShared*>(at)),
      slots_(reinterpret_cast<CqSlot*>(shared_ + 1)),
      capacity_(capacity),
      mask_(capacity - 1) {
  std::memset(at, 0, bytesFor(capacity));
  shared_->capacity.store(capacity, std::memory_order_relaxed);
  for (uint64_t i = 0; i < capacity; ++i) {
    slots_[i].word.store(slotWord(i, 0, kFree), std::memory_order_relaxed);
  }
}

const CqSlot* CqRing::front(int self) {
  for (;;) {
    const CqSlot& s = slots_[head_ & mask_];
    const uint64_t word = s.word.load(std::memory_order_acquire);
    if (word == slotWord(head_, 0, kPublished)) return &s;
    if (!skipDeadProducer(word, self)) return nullptr;
  }
}

void CqRing::pop() {
  slots_[head_ & mask_].word.store(slotWord(head_ + capacity_, 0, kFree),
                                   std::memory_order_release);
  ++head_;
}

bool CqRing::headTaken() const {
  return slots_[head_ & mask_].word.load(std::memory_order_acquire) != slotWord(head_, 0, kFree);
}

bool CqRing::skipDeadProducer(uint64_t word, int self) {
  if (stateOf(word) != kClaimed || ticketOf(word) != (head_ & kTicketMask)) return false;
  const Clock::time_point now = Clock::now();
  if (stalledTicket_ != head_) {
    stalledTicket_ = head_, stalledSince_ = now;
    return false;
  }
  if (now - stalledSince_ < kStalledSlot) return false;
  stalledSince_ = now;
  const int pid = static_cast<int>(pidOf(word));
  if (pid == self || !processGone(pid)) return false;
  if (!slots_[head_ & mask_].word.compare_exchange_strong(
          word, slotWord(head_ + capacity_, 0, kFree), std::memory_order_acq_rel)) {
    return false;
  }
  ++head_;
  return true;
}

// ------------------------------------------------------------ peers

namespace {

// A target block's memfd, whole; false where the fd has been reused for
// something else since (its header says so).
bool mapTarget(int file, const struct stat& st, uint64_t id, RemoteBlock* out) {
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(BlockHeader)) return false;
  void* mapping = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file, 0);
  if (mapping == MAP_FAILED) return false;
  auto* h = static_cast<BlockHeader*>(mapping);
  if (h->magic.load(std::memory_order_acquire) != kBlockMagic || h->id != id ||
      h->dataOffset > size || h->bytes > size - h->dataOffset) {
    munmap(mapping, size);
    return false;
  }
  out->mapping = static_cast<uint8_t*>(mapping), out->mapBytes = size;
  out->data = out->mapping + h->dataOffset, out->bytes = h->bytes, out->header = h;
  return true;
}

// The registered range of a dma-buf region's file, from the page it
// starts in. Its key still there after the open means the descriptor was
// still the region's dup (deregister clears the key first); the inode
// says it is the file registered.
bool mapDmabuf(int file, const struct stat& st, const PeerNode* peer, const MrRecord& m,
               RemoteBlock* out) {
  const auto size = static_cast<uint64_t>(st.st_size);
  if (peer->mrs[m.slot].key.load(std::memory_order_seq_cst) != m.key ||
      static_cast<uint64_t>(st.st_ino) != m.inode || m.length == 0 || m.fileOffset > size ||
      m.length > size - m.fileOffset) {
    return false;
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = m.fileOffset / page * page;
  const uint64_t bytes = m.fileOffset - start + m.length;
  void* mapping =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file, static_cast<off_t>(start));
  if (mapping == MAP_FAILED) return false;
  out->mapping = static_cast<uint8_t*>(mapping), out->mapBytes = bytes;
  out->data = out->mapping + (m.fileOffset - start), out->bytes = m.length, out->header = nullptr;
  out->nodeId = peer->nodeId, out->slot = m.slot, out->key = m.key;
  return true;
}

void unmapNode(const PeerNode& p) {
  munmap(p.base, p.bytes);
  if (p.pidfd >= 0) close(p.pidfd);
}

}  // namespace

PeerMap::PeerMap(std::string fabric, int pid) : fabric_(std::move(fabric)), pid_(pid) {}

PeerMap::~PeerMap() {
  for (auto& peer : peers_) unmapNode(*peer);
  for (auto& [id, block] : blocks_) munmap(block.mapping, block.mapBytes);
}

PeerNode* PeerMap::findQp(int pid, uint32_t qpNum, SharedQp** found) {
  auto lookIn = [&](PeerNode* p) {
    for (uint32_t i = 0; i < p->maxQps; ++i) {
      if (qpNum != 0 && p->qps[i].qpNum.load(std::memory_order_acquire) == qpNum) {
        *found = &p->qps[i];
        return true;
      }
    }
    return false;
  };
  // Nodes closed since and no longer used go first.
  peers_.erase(std::remove_if(peers_.begin(), peers_.end(),
                              [](const std::unique_ptr<PeerNode>& p) {
                                if (p->users > 0 || p->header->magic.load() == kNodeMagic) {
                                  return false;
                                }
                                unmapNode(*p);
                                return true;
                              }),
               peers_.end());
  for (auto& p : peers_) {
    if (p->pid == pid && lookIn(p.get())) return p.get();
  }
  const std::string dir = format("/proc/%d/fd", pid);
  const std::string want = std::string("/memfd:") + kNodeName + fabric_ + " (deleted)";
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return nullptr;
  PeerNode* result = nullptr;
  while (dirent* entry = readdir(listing)) {
    if (entry->d_name[0] == '.') continue;
    const std::string path = dir + "/" + entry->d_name;
    char link[512];
    const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    if (n <= 0 || want.compare(0, std::string::npos, link, static_cast<size_t>(n)) != 0) continue;
    PeerNode* p = mapNode(pid, path);
    if (p != nullptr && lookIn(p)) {
      result = p;
      break;
    }
  }
  closedir(listing);
  return result;
}

PeerNode* PeerMap::mapNode(int pid, const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(NodeHeader))) {
    base =
        mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  auto p = std::make_unique<PeerNode>();
  p->base = static_cast<uint8_t*>(base), p->bytes = static_cast<uint64_t>(st.st_size);
  p->header = reinterpret_cast<NodeHeader*>(base);
  const NodeHeader* h = p->header;
  // Inherited memfds of a parent process show up too: the pid tells.
  bool fits = h->magic.load(std::memory_order_acquire) == kNodeMagic &&
              h->version == kLayoutVersion && h->pid == pid && h->bytes <= p->bytes &&
              std::strncmp(h->fabric, fabric_.c_str(), sizeof h->fabric) == 0 &&
              h->qpTable + uint64_t{h->maxQps} * sizeof(SharedQp) <= p->bytes &&
              h->mrTable + uint64_t{h->maxMrs} * sizeof(SharedMr) <= p->bytes;
  for (auto& known : peers_) fits = fits && known->nodeId != h->nodeId;
  if (!fits) {
    munmap(base, p->bytes);
    return nullptr;
  }
  p->pid = pid, p->self = pid == pid_, p->nodeId = h->nodeId;
  p->qps = reinterpret_cast<SharedQp*>(p->base + h->qpTable);
  p->mrs = reinterpret_cast<SharedMr*>(p->base + h->mrTable);
  p->maxQps = h->maxQps, p->maxMrs = h->maxMrs;
  if (!p->self) p->pidfd = pidfdOpen(pid);
  peers_.push_back(std::move(p));
  return peers_.back().get();
}

// Unmaps the blocks whose memory has gone: target blocks released,
// dma-buf regions deregistered (or on a node no longer mapped).
void PeerMap::sweepBlocks() {
  auto gone = [this](const RemoteBlock& b) {
    if (b.header != nullptr) return b.header->released.load(std::memory_order_relaxed) != 0;
    for (const auto& p : peers_) {
      if (p->nodeId == b.nodeId) return p->mrs[b.slot].key.load(std::memory_order_relaxed) != b.key;
    }
    return true;
  };
  for (auto b = blocks_.begin(); b != blocks_.end();) {
    if (gone(b->second)) {
      munmap(b->second.mapping, b->second.mapBytes);
      b = blocks_.erase(b);
    } else {
      ++b;
    }
  }
}

// The peer's target block or dma-buf region `m` names, mapped here and
// cached by the block's id, which is new for every dma-buf registration:
// a mapping is never found for another one.
RemoteBlock* PeerMap::mapBlock(const PeerNode* peer, const MrRecord& m) {
  auto it = blocks_.find(m.blockId);
  if (it != blocks_.end()) return &it->second;
  sweepBlocks();
  const int file = open(format("/proc/%d/fd/%d", peer->pid, m.blockFd).c_str(), O_RDWR | O_CLOEXEC);
  if (file < 0) return nullptr;
  struct stat st {};
  RemoteBlock block{};
  const bool mapped =
      fstat(file, &st) == 0 && (m.kind == BlockKind::Target ? mapTarget(file, st, m.blockId, &block)
                                                            : mapDmabuf(file, st, peer, m, &block));
  close(file);
  if (!mapped) return nullptr;
  return &blocks_.emplace(m.blockId, block).first->second;
}

bool PeerMap::resolve(const PeerNode* peer, uint32_t rkey, uint64_t address, uint32_t bytes,
                      int access, uint8_t** out) {
  const uint32_t slot = rkey >> 8;
  if (rkey == 0 || slot >= peer->maxMrs) return false;
  const SharedMr& s = peer->mrs[slot];
  if (s.key.load(std::memory_order_acquire) != rkey) return false;
  MrRecord m;
  m.slot = slot, m.key = rkey;
  m.access = s.access.load(std::memory_order_acquire);
  m.kind = static_cast<BlockKind>(s.kind.load(std::memory_order_acquire));
  m.blockFd = s.blockFd.load(std::memory_order_acquire);
  m.address = s.address.load(std::memory_order_acquire);
  m.length = s.length.load(std::memory_order_acquire);
  m.blockId = s.blockId.load(std::memory_order_acquire);
  m.blockAddress = s.blockAddress.load(std::memory_order_acquire);
  m.fileOffset = s.fileOffset.load(std::memory_order_acquire);
  m.inode = s.inode.load(std::memory_order_acquire);
  if (s.key.load(std::memory_order_relaxed) != rkey) return false;  // changed under us
  if ((m.access & static_cast<uint32_t>(access)) == 0 ||
      !within(address, bytes, m.address, m.length) || m.blockFd < 0 ||
      (m.kind != BlockKind::Target && m.kind != BlockKind::Dmabuf)) {
    return false;
  }
  RemoteBlock* block = mapBlock(peer, m);
  if (block == nullptr ||
      (block->header != nullptr && block->header->released.load(std::memory_order_relaxed) != 0) ||
      !within(address, bytes, m.blockAddress, block->bytes)) {
    return false;
  }
  *out = block->data + (address - m.blockAddress);
  return true;
}

}  // namespace braid::transport::ibverbs::fake_fabric
