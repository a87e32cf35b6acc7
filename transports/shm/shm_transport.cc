#include "transports/shm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/wiring.h"
#include "tuning/cost_model.h"

namespace braid::transport::shm {
namespace {

constexpr uint64_t kMagic = 0x31444952424d4853ull;  // "SHMBRID1"
constexpr size_t kLine = 64;

static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

// Every slot has a header of eight cache lines, each starting with a copy of
// the flag: the sender publishes message m by storing m + 1 into the flag
// of every line the message uses, after that line's other bytes. Messages of
// up to kInline bytes travel inside these lines (48 bytes in the first, 56
// in each other), so the receiver, which polls the flags of all the lines it
// expects at once, gets them in one round of cache-line transfers instead of
// a flag first and the data after it. Larger messages sit in the slot's
// data area and use the first line only.
constexpr size_t kHeaderLines = 8;
constexpr size_t kFirstLineData = 48;
constexpr size_t kLineData = 56;
constexpr size_t kInline = kFirstLineData + (kHeaderLines - 1) * kLineData;
struct alignas(kLine) FirstLine {
  std::atomic<uint64_t> seq;
  uint32_t bytes;
  uint32_t tag;
  std::byte data[kFirstLineData];
};
struct alignas(kLine) Line {
  std::atomic<uint64_t> seq;
  std::byte data[kLineData];
};
struct SlotHeader {
  FirstLine first;
  Line rest[kHeaderLines - 1];
};
static_assert(sizeof(FirstLine) == kLine && sizeof(Line) == kLine &&
                  sizeof(SlotHeader) == kHeaderLines * kLine,
              "a slot header is eight whole cache lines");

// Header lines beyond the first that an inline message of `bytes` uses.
constexpr size_t extraLines(size_t bytes) {
  return bytes <= kFirstLineData ? 0 : (bytes - kFirstLineData + kLineData - 1) / kLineData;
}

// A message by reference (Connection::postReference) has this bit set in
// its `bytes` and this in its first line's data: where the bytes lie in the
// sender's memory and how the receiver maps that memory (pidfd_getfd of the
// sender's memfd). A message by address (Connection::postAddress) is one
// whose region is 0, and `offset` is then the address of its bytes in the
// sender's process.
constexpr uint32_t kReferenceBit = 1u << 31;
struct Reference {
  uint64_t region;  // memory::Region::id, unique in the sender's process; 0: by address
  uint64_t regionBytes;
  uint64_t offset;
  uint64_t freed;  // memory::freeCount() in the sender when it posted this
  int32_t fd;      // the sender's fd for the region
};
static_assert(sizeof(Reference) <= kFirstLineData, "a reference fits in the first line");

// How far the receiver has read; only grows. The sender reads it only when
// its own view says the FIFO is full. `readsByAddress`: 1 when the
// receiver reads messages by address (Connection::carriesAddresses),
// written before the ranks' last exchange at set-up and read after it.
struct FifoControl {
  alignas(kLine) std::atomic<uint64_t> head;
  uint64_t readsByAddress;
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t fifos;
  uint32_t slots;
  uint64_t slotBytes;
  int32_t pid;                      // the owner, for liveness checks
  int32_t probeFd;                  // an fd the owner holds open while peers connect (see create)
  uint64_t self;                    // where the owner maps this segment (see readsByAddress)
  std::atomic<uint32_t> closed;     // set when the owner destroyed its transport or gave up
  std::atomic<int32_t> failedRank;  // whom the owner blamed when it gave up (-1: nobody)
  std::atomic<uint32_t> reason;     // why: a GiveUpReason
  std::atomic<int32_t> waitingFor;  // the rank the owner is stuck waiting for (-1: none)
  // The owner sleeps on `doorbell` with `sleeping` set; whoever changes one
  // of the owner's FIFOs and sees `sleeping` bumps the doorbell and wakes it.
  alignas(kLine) std::atomic<uint32_t> doorbell;
  alignas(kLine) std::atomic<uint32_t> sleeping;
  // The CPU the owner ran on when it last started to idle (-1: unknown).
  alignas(kLine) std::atomic<int32_t> cpu;
};

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where things are in a segment with `fifos` FIFOs.
struct Layout {
  size_t controls, headers, data, total;
  Layout(size_t fifos, size_t slots, size_t slotBytes) {
    controls = roundUp(sizeof(SegmentHeader), 4096);
    headers = roundUp(controls + fifos * sizeof(FifoControl), kLine);
    data = roundUp(headers + fifos * slots * sizeof(SlotHeader), 4096);
    total = data + fifos * slots * slotBytes;
  }
};

// One direction of a pair, inside the receiver's segment.
struct Fifo {
  FifoControl* control;
  SlotHeader* slots;
  std::byte* data;
};

// Maps every page of a FIFO's slots into this process now, so that the
// first messages through it do not each take a page fault per 4 KiB (tens
// of microseconds a slot on a virtual machine). Best effort.
void prefault(std::byte* data, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
#ifdef MADV_POPULATE_WRITE
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
#endif
  // Older kernels: a read maps a shared page writable (tmpfs keeps no
  // dirty accounting).
  for (uintptr_t at = begin; at < end; at += page)
    static_cast<void>(*reinterpret_cast<const volatile std::byte*>(at));
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Gives the memory of `bytes` at `data`, in a shared mapping, back to the
// system (the whole pages inside it).
void release(std::byte* data, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_REMOVE);
}

// Wakes the segment's owner if it sleeps. The caller's seq_cst store of the
// counter it changed and this seq_cst load pair with the owner's seq_cst
// store of `sleeping` and its re-read of the counters (see waitForActivity):
// either the owner sees the change, or this sees it sleeping.
void ring(SegmentHeader* owner) {
  if (owner->sleeping.load(std::memory_order_seq_cst) == 0) return;
  owner->doorbell.fetch_add(1, std::memory_order_seq_cst);
  futex(&owner->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
}

// Whether this process may read the memory of the owner of `theirs` by
// address: process_vm_readv of the segment's magic where its owner maps
// it. The kernel allows it with ptrace rights over the owner, as it does
// pidfd_getfd, but a seccomp filter (a container's) may refuse one and not
// the other. When it may not, says why once per process.
bool readsByAddress(const SegmentHeader* theirs, int peer) {
  uint64_t magic = 0;
  iovec local{&magic, sizeof magic};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(theirs->self)), sizeof magic};
  if (::process_vm_readv(theirs->pid, &local, 1, &remote, 1, 0) ==
          static_cast<ssize_t>(sizeof magic) &&
      magic == kMagic)
    return true;
  const int error = errno;
  static std::atomic<bool> told{false};
  if (!told.exchange(true)) {
    std::string policy;
    if (FILE* file = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
      int scope = -1;
      if (std::fscanf(file, "%d", &scope) == 1 && scope > 0)
        policy = format(
            " (kernel.yama.ptrace_scope is %d: only 0 lets a process read another "
            "of its user's)",
            scope);
      std::fclose(file);
    }
    BRAID_INFO(Init,
               "shm: no single copy by address: this process cannot read rank %d's memory "
               "(process_vm_readv: %s)%s; pieces go through slots",
               peer, std::strerror(error), policy.c_str());
  }
  return false;
}

class Segment {
 public:
  Segment() = default;
  Segment(void* base, size_t size) : base_(static_cast<std::byte*>(base)), size_(size) {}
  Segment(Segment&& other) noexcept : base_(other.base_), size_(other.size_) {
    other.base_ = nullptr;
  }
  Segment& operator=(Segment&& other) noexcept {
    if (this != &other) {
      unmap();
      base_ = other.base_;
      size_ = other.size_;
      other.base_ = nullptr;
    }
    return *this;
  }
  ~Segment() { unmap(); }

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }  // or null
  Fifo fifo(size_t index) const {
    const SegmentHeader* h = header();
    Layout layout(h->fifos, h->slots, h->slotBytes);
    return {reinterpret_cast<FifoControl*>(base_ + layout.controls) + index,
            reinterpret_cast<SlotHeader*>(base_ + layout.headers) + index * h->slots,
            base_ + layout.data + index * h->slots * h->slotBytes};
  }

 private:
  void unmap() {
    if (base_) ::munmap(base_, size_);
    base_ = nullptr;
  }

  std::byte* base_ = nullptr;
  size_t size_ = 0;
};

class ShmConnection final : public Connection {
 public:
  // `outData` and `inData` are the segments that hold out.data and in.data.
  ShmConnection(int peer, Fifo out, SegmentHeader* peerHeader, Fifo in, size_t slotBytes,
                size_t slots, std::shared_ptr<const Segment> outData,
                std::shared_ptr<const Segment> inData)
      : peer_(peer),
        out_(out),
        peerHeader_(peerHeader),
        in_(in),
        slotBytes_(slotBytes),
        slots_(slots),
        outData_(std::move(outData)),
        inData_(std::move(inData)) {}

  size_t slotBytes() const override { return slotBytes_; }

  std::byte* sendSlot(size_t bytes) override {
    if (sendTail_ - sendHeadSeen_ == slots_) {
      sendHeadSeen_ = out_.control->head.load(std::memory_order_acquire);
      if (sendTail_ - sendHeadSeen_ == slots_) return nullptr;
    }
    const size_t slot = sendTail_ % slots_;
    if (bytes <= kFirstLineData) return out_.slots[slot].first.data;
    return bytes <= kInline ? sendStage_ : out_.data + slot * slotBytes_;
  }

  void postSend(uint32_t bytes, uint32_t tag) override {
    SlotHeader& header = out_.slots[sendTail_ % slots_];
    const uint64_t seq = ++sendTail_;
    if (bytes > kFirstLineData && bytes <= kInline) {  // spread the staged message over the lines
      std::memcpy(header.first.data, sendStage_, kFirstLineData);
      const size_t lines = extraLines(bytes);
      for (size_t i = 0; i < lines; ++i) {
        std::memcpy(header.rest[i].data, sendStage_ + kFirstLineData + i * kLineData, kLineData);
        header.rest[i].seq.store(seq, std::memory_order_release);
      }
    }
    header.first.bytes = bytes;
    header.first.tag = tag;
    header.first.seq.store(seq, std::memory_order_seq_cst);
    ring(peerHeader_);
  }

  const Message* peekRecv() override {
    const size_t slot = recvHead_ % slots_;
    const SlotHeader& header = in_.slots[slot];
    const uint64_t want = recvHead_ + 1;
    // The flags of the lines the last inline message used are read along
    // with the first one, so that all those lines are fetched together.
    const bool firstReady = header.first.seq.load(std::memory_order_acquire) == want;
    bool restReady = linesReady(header, expectLines_, want);
    if (!firstReady) return nullptr;
    // The peer is trusted with its data, not with our bounds.
    const uint32_t raw = header.first.bytes;
    const uint32_t bytes =
        static_cast<uint32_t>(std::min<size_t>(raw & ~kReferenceBit, slotBytes_));
    const uint32_t tag = header.first.tag;
    if (raw & kReferenceBit) {
      Reference reference;
      std::memcpy(&reference, header.first.data, sizeof reference);
      if (reference.region == 0) {
        if (!readsByAddress_)
          throw Error(ErrorCode::Internal,
                      format("shm: rank %d sent an address this rank cannot read", peer_));
        current_ = {reinterpret_cast<const std::byte*>(reference.offset), bytes, tag, true, true};
        return &current_;
      }
      if (reference.offset > reference.regionBytes ||
          bytes > reference.regionBytes - reference.offset)
        throw Error(ErrorCode::Internal,
                    format("shm: rank %d referred to bytes outside its memory region", peer_));
      current_ = {map(reference) + reference.offset, bytes, tag, false, true};
      return &current_;
    }
    if (bytes > kInline) {
      current_ = {in_.data + slot * slotBytes_, bytes, tag};
      return &current_;
    }
    if (bytes <= kFirstLineData) {
      current_ = {header.first.data, bytes, tag};
      return &current_;
    }
    const size_t lines = extraLines(bytes);
    if (lines != expectLines_) {
      expectLines_ = lines;
      restReady = linesReady(header, lines, want);
    }
    if (!restReady) return nullptr;
    std::memcpy(recvStage_, header.first.data, kFirstLineData);
    for (size_t i = 0; i < lines; ++i)
      std::memcpy(recvStage_ + kFirstLineData + i * kLineData, header.rest[i].data, kLineData);
    current_ = {recvStage_, bytes, tag};
    return &current_;
  }

  void releaseRecv() override {
    ++recvHead_;
    in_.control->head.store(recvHead_, std::memory_order_seq_cst);
    ring(peerHeader_);
  }

  bool carriesReferences() const override { return peerMapsOurs_; }

  uint64_t postReference(const memory::Region& region, size_t offset, uint32_t bytes,
                         uint32_t tag) override {
    return post({region.id, region.bytes, offset, memory::freeCount(), region.fd}, bytes, tag);
  }

  bool consumed(uint64_t ticket) const override {
    return out_.control->head.load(std::memory_order_acquire) >= ticket;
  }

  bool carriesAddresses() const override { return peerReadsByAddress_; }

  uint64_t postAddress(const std::byte* data, uint32_t bytes, uint32_t tag) override {
    return post({0, 0, reinterpret_cast<uintptr_t>(data), 0, -1}, bytes, tag);
  }

  bool readRemote(std::byte* to, const std::byte* from, size_t bytes) override {
    while (bytes > 0) {
      iovec local{to, bytes};
      iovec remote{const_cast<std::byte*>(from), bytes};
      const ssize_t got = ::process_vm_readv(peerHeader_->pid, &local, 1, &remote, 1, 0);
      if (got <= 0) {
        const int error = got < 0 ? errno : EFAULT;
        if (error == ESRCH) {  // (its pid may be a zombie's, or nobody's)
          dead_ = true;
          return false;
        }
        // A peer that gave up or is exiting frees what it lent (it gives
        // up before its failed op's buffers go): its failure, not ours.
        checkAlive();
        if (peerClosed()) return false;
        throw Error(error == EFAULT ? ErrorCode::Internal : ErrorCode::SystemError,
                    format("shm: cannot read %zu bytes of rank %d's memory by address: %s", bytes,
                           peer_, std::strerror(error)));
      }
      to += got, from += got, bytes -= static_cast<size_t>(got);
    }
    return true;
  }

  std::string copyPaths() const override {
    std::string paths = "slots";
    if (peerMapsOurs_) paths += ", memAlloc in place";
    if (peerReadsByAddress_) paths += ", by address";
    return paths;
  }

  // Whether this rank reads the peer's messages by address (it told the
  // peer so through the FIFO's control), and whether the peer reads this
  // rank's.
  void allowAddresses(bool readsByAddress, bool peerReadsByAddress) {
    readsByAddress_ = readsByAddress;
    peerReadsByAddress_ = peerReadsByAddress;
  }

  // This rank's handle on the peer's process (-1: none), and whether
  // references may go each way: the peer maps this rank's memory, and this
  // rank takes the peer's memfds through the handle.
  void allowReferences(int peerPidfd, bool peerMapsOurs, bool mapsPeers) {
    peerPidfd_ = peerPidfd;
    peerMapsOurs_ = peerMapsOurs;
    mapsPeers_ = mapsPeers;
  }

  bool flushed() const override { return true; }  // a posted slot is already the peer's
  bool peerClosed() const override {
    return dead_ || peerHeader_->closed.load(std::memory_order_acquire) != 0;
  }
  // (Readable after the peer's death: its segment stays mapped here.)
  int failedRank() const override {
    return peerHeader_->failedRank.load(std::memory_order_acquire);
  }
  GiveUpReason peerReason() const override {
    return static_cast<GiveUpReason>(peerHeader_->reason.load(std::memory_order_acquire));
  }
  int peerWaitsFor() const override {
    return peerHeader_->waitingFor.load(std::memory_order_acquire);
  }
  // The peer's process is gone (it cannot have closed cleanly). Its pidfd
  // turns readable when it exits, also while it waits as a zombie for its
  // parent to reap it, which kill(pid, 0) would still find.
  void checkAlive() {
    if (dead_) return;
    if (peerPidfd_ >= 0) {
      pollfd exited{peerPidfd_, POLLIN, 0};
      dead_ = ::poll(&exited, 1, 0) > 0;
      return;
    }
    if (::kill(peerHeader_->pid, 0) != 0 && errno == ESRCH) dead_ = true;
  }
  void wakePeer() { ring(peerHeader_); }

  // Changes whenever the peer sends this rank its next message or frees a
  // slot of ours.
  uint64_t activity() const {
    return in_.slots[recvHead_ % slots_].first.seq.load(std::memory_order_seq_cst) +
           out_.control->head.load(std::memory_order_seq_cst);
  }
  int peer() const { return peer_; }
  size_t slots() const { return slots_; }

  // After a shrink, a connection of the new communicator to the same peer
  // takes over the data areas of this one's FIFOs each way, the segments
  // they lie in, and what this one knows of references.
  void handOver(Fifo* out, Fifo* in, std::shared_ptr<const Segment>* outSegment,
                std::shared_ptr<const Segment>* inSegment) {
    out->data = out_.data;
    in->data = in_.data;
    *outSegment = outData_;
    *inSegment = inData_;
    handedOver_ = true;
  }
  void handOverReferences(ShmConnection& successor) const {
    successor.allowReferences(peerPidfd_ >= 0 ? ::fcntl(peerPidfd_, F_DUPFD_CLOEXEC, 0) : -1,
                              peerMapsOurs_, mapsPeers_);
    successor.allowAddresses(readsByAddress_, peerReadsByAddress_);
  }
  bool handedOver() const { return handedOver_; }
  // Gives the memory of the incoming FIFO's data area back to the system.
  void releaseInData() { release(in_.data, slots_ * slotBytes_); }

  ~ShmConnection() override {
    unmapAll();
    if (peerPidfd_ >= 0) ::close(peerPidfd_);
  }

 private:
  // The peer's memory region of `reference`, mapped here (read-only).
  const std::byte* map(const Reference& reference) {
    if (reference.freed != peerFreed_) {  // the peer freed regions: forget every mapping
      unmapAll();
      peerFreed_ = reference.freed;
    }
    for (const Mapping& mapping : mappings_)
      if (mapping.region == reference.region) return mapping.base;
    if (!mapsPeers_)
      throw Error(ErrorCode::Internal,
                  format("shm: rank %d sent a reference this rank cannot map", peer_));
    if (mappings_.size() == kMaxMappings) {
      ::munmap(const_cast<std::byte*>(mappings_.front().base), mappings_.front().bytes);
      mappings_.erase(mappings_.begin());
    }
    const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, peerPidfd_, reference.fd, 0));
    if (fd < 0)
      throw Error(ErrorCode::SystemError, format("shm: cannot take rank %d's memory region: %s",
                                                 peer_, std::strerror(errno)));
    struct stat info {};
    void* base = MAP_FAILED;
    std::string problem;
    if (::fstat(fd, &info) != 0 || static_cast<uint64_t>(info.st_size) < reference.regionBytes)
      problem = format("rank %d's memory region is smaller than its message says", peer_);
    else if ((base = ::mmap(nullptr, reference.regionBytes, PROT_READ, MAP_SHARED, fd, 0)) ==
             MAP_FAILED)
      problem = format("cannot map rank %d's memory region: %s", peer_, std::strerror(errno));
    ::close(fd);
    if (!problem.empty()) throw Error(ErrorCode::SystemError, "shm: " + problem);
    mappings_.push_back({reference.region, static_cast<const std::byte*>(base),
                         static_cast<size_t>(reference.regionBytes)});
    return mappings_.back().base;
  }

  void unmapAll() {
    for (const Mapping& mapping : mappings_)
      ::munmap(const_cast<std::byte*>(mapping.base), mapping.bytes);
    mappings_.clear();
  }

  // Publishes the reserved slot as `reference` to `bytes` of the sender's
  // memory; returns its sequence number, the ticket for consumed().
  uint64_t post(const Reference& reference, uint32_t bytes, uint32_t tag) {
    SlotHeader& header = out_.slots[sendTail_ % slots_];
    std::memcpy(header.first.data, &reference, sizeof reference);
    const uint64_t seq = ++sendTail_;
    header.first.bytes = bytes | kReferenceBit;
    header.first.tag = tag;
    header.first.seq.store(seq, std::memory_order_seq_cst);
    ring(peerHeader_);
    return seq;
  }

  // Whether the first `lines` lines after the first carry message `want`.
  static bool linesReady(const SlotHeader& header, size_t lines, uint64_t want) {
    bool ready = true;
    for (size_t i = 0; i < lines; ++i)
      ready &= header.rest[i].seq.load(std::memory_order_acquire) == want;
    return ready;
  }

  int peer_;
  Fifo out_;  // in the peer's segment
  SegmentHeader* peerHeader_;
  Fifo in_;  // in this rank's segment
  size_t slotBytes_;
  size_t slots_;
  std::shared_ptr<const Segment> outData_, inData_;
  uint64_t sendTail_ = 0;      // messages posted
  uint64_t sendHeadSeen_ = 0;  // the peer's head as last read
  uint64_t recvHead_ = 0;      // messages read: this rank's copy of in_.head
  size_t expectLines_ = 0;     // header lines past the first the next message likely uses
  Message current_;
  alignas(kLine) std::byte sendStage_[kInline];  // an inline message, until postSend
  alignas(kLine) std::byte recvStage_[kInline];  // the received one, gathered

  // References.
  struct Mapping {
    uint64_t region;
    const std::byte* base;
    size_t bytes;
  };
  static constexpr size_t kMaxMappings = 64;
  bool peerMapsOurs_ = false;
  bool mapsPeers_ = false;
  // Addresses.
  bool readsByAddress_ = false;      // the peer may send this rank addresses
  bool peerReadsByAddress_ = false;  // this rank may send the peer addresses
  int peerPidfd_ = -1;
  uint64_t peerFreed_ = 0;         // the peer's memory::freeCount() when mappings_ were made
  std::vector<Mapping> mappings_;  // the peer's regions, oldest first
  bool dead_ = false;
  bool handedOver_ = false;
};

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(int nranks) : own_(std::make_shared<Segment>()), byRank_(nranks, nullptr) {}
  ~ShmTransport() override {
    close();
    closeProbe();
    // The data areas a shrunk communicator did not take over, those of the
    // ranks it left out, go back to the system; the others are its now.
    if (handedOver_)
      for (const auto& connection : connections_)
        if (!connection->handedOver()) connection->releaseInData();
  }

  void announceFailure(int failedRank, GiveUpReason reason) override {
    if (SegmentHeader* mine = own_->header()) {
      mine->reason.store(static_cast<uint32_t>(reason), std::memory_order_relaxed);
      mine->failedRank.store(failedRank, std::memory_order_release);
    }
    close();
  }

  void announceWaitingFor(int rank) override {
    if (SegmentHeader* mine = own_->header()) {
      mine->waitingFor.store(rank, std::memory_order_seq_cst);
      for (auto& connection : connections_) connection->wakePeer();
    }
  }

  const char* name() const override { return "shm"; }
  Connection& connection(int peer) override { return *byRank_[peer]; }

  bool progress() override { return false; }  // peers write straight into our slots
  bool passive() const override { return true; }

  void prepareToWait() override {
    seen_ = activity();
    const int cpu = ::sched_getcpu();
    own_->header()->cpu.store(cpu, std::memory_order_relaxed);
    sharingPeer_ = -1;
    for (size_t i = 0; i < peers_.size() && cpu >= 0; ++i)
      if (peers_[i]->header()->cpu.load(std::memory_order_relaxed) == cpu &&
          (sharingPeer_ < 0 || connections_[i]->peer() < sharingPeer_))
        sharingPeer_ = connections_[i]->peer();
  }

  int cpuSharingPeer() const override { return sharingPeer_; }

  void waitForActivity(Clock::time_point until) override {
    SegmentHeader* mine = own_->header();
    uint32_t bell = mine->doorbell.load(std::memory_order_seq_cst);
    mine->sleeping.store(1, std::memory_order_seq_cst);
    if (activity() == seen_) {
      auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now());
      if (wait.count() > 0) {
        timespec timeout{static_cast<time_t>(wait.count() / 1000000000),
                         static_cast<long>(wait.count() % 1000000000)};
        futex(&mine->doorbell, FUTEX_WAIT, bell, &timeout);
      }
    }
    mine->sleeping.store(0, std::memory_order_relaxed);
    // A peer that died cannot say so: look for it now and then while idle.
    if (Clock::now() - lastLivenessCheck_ > kLivenessInterval) {
      lastLivenessCheck_ = Clock::now();
      for (auto& connection : connections_) connection->checkAlive();
    }
  }

  // Tells the peers this rank is gone, and wakes any that sleep waiting for it.
  void close() {
    if (SegmentHeader* mine = own_->header()) {
      mine->closed.store(1, std::memory_order_seq_cst);
      mine->doorbell.fetch_add(1, std::memory_order_seq_cst);
      futex(&mine->doorbell, FUTEX_WAKE, INT_MAX, nullptr);
    }
    for (auto& connection : connections_) connection->wakePeer();
  }

  void closeProbe() {
    if (probeFd_ >= 0) ::close(probeFd_);
    probeFd_ = -1;
  }

  std::shared_ptr<Segment> own_;
  int probeFd_ = -1;  // own_'s fd, open until every peer tried to take it
  std::vector<std::shared_ptr<Segment>> peers_;
  std::vector<std::unique_ptr<ShmConnection>> connections_;
  std::vector<ShmConnection*> byRank_;
  bool handedOver_ = false;  // a shrunk communicator's connections took over the data areas

 private:
  uint64_t activity() const {
    uint64_t sum = 0;
    for (const auto& c : connections_) sum += c->activity();
    return sum;
  }
  static constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
  uint64_t seen_ = 0;
  int sharingPeer_ = -1;
  Clock::time_point lastLivenessCheck_{};
};

std::string segmentName(uint64_t secret, int rank) {
  return format("/braid-%016llx-%d", static_cast<unsigned long long>(secret), rank);
}

// Creates, sizes and maps this rank's segment; reserve() backs it with
// memory. Returns "" or why it failed. Keeps the segment's fd open in *fd
// (see SegmentHeader::probeFd).
std::string createOwn(const std::string& name, const Layout& layout, size_t fifos, int slots,
                      size_t slotBytes, Segment* out, int* keptFd) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {  // left by a crashed job with the same secret
    ::shm_unlink(name.c_str());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) return format("shm_open(%s): %s", name.c_str(), std::strerror(errno));
  std::string problem;
  if (::ftruncate(fd, static_cast<off_t>(layout.total)) != 0)
    problem = format("ftruncate(%s, %zu): %s", name.c_str(), layout.total, std::strerror(errno));
  void* base = problem.empty()
                   ? ::mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  if (problem.empty() && base == MAP_FAILED)
    problem = format("mmap(%s): %s", name.c_str(), std::strerror(errno));
  if (!problem.empty()) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return problem;
  }
  *keptFd = fd;
  auto* header = new (base) SegmentHeader{};
  header->fifos = static_cast<uint32_t>(fifos);
  header->slots = static_cast<uint32_t>(slots);
  header->slotBytes = slotBytes;
  header->pid = static_cast<int32_t>(::getpid());
  header->probeFd = fd;
  header->self = reinterpret_cast<uintptr_t>(base);
  header->cpu.store(-1, std::memory_order_relaxed);
  header->failedRank.store(-1, std::memory_order_relaxed);
  header->waitingFor.store(-1, std::memory_order_relaxed);
  auto* bytes = static_cast<std::byte*>(base);
  auto* controls = reinterpret_cast<FifoControl*>(bytes + layout.controls);
  for (size_t i = 0; i < fifos; ++i) new (controls + i) FifoControl{};
  auto* headers = reinterpret_cast<SlotHeader*>(bytes + layout.headers);
  for (size_t i = 0; i < fifos * static_cast<size_t>(slots); ++i) new (headers + i) SlotHeader{};
  header->magic = kMagic;
  *out = Segment(base, layout.total);
  return "";
}

// Backs the first `bytes` of this rank's segment (`fd`) with memory now, so
// that a full /dev/shm is an error here rather than a SIGBUS later.
std::string reserve(int fd, const std::string& name, size_t bytes) {
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0)
    return format("%s needs %zu bytes of /dev/shm: %s", name.c_str(), bytes, std::strerror(err));
  return "";
}

// Maps a peer's segment and checks it is what this rank expects.
std::string mapPeer(const std::string& name, const Layout& layout, size_t fifos, int slots,
                    size_t slotBytes, Segment* out) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return format("shm_open(%s): %s", name.c_str(), std::strerror(errno));
  struct stat info {};
  std::string problem;
  if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != layout.total)
    problem = format("%s has %lld bytes, expected %zu", name.c_str(),
                     static_cast<long long>(info.st_size), layout.total);
  void* base = problem.empty()
                   ? ::mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  if (problem.empty() && base == MAP_FAILED)
    problem = format("mmap(%s): %s", name.c_str(), std::strerror(errno));
  ::close(fd);
  if (!problem.empty()) return problem;
  Segment segment(base, layout.total);
  const SegmentHeader* h = segment.header();
  if (h->magic != kMagic || h->fifos != fifos || h->slots != static_cast<uint32_t>(slots) ||
      h->slotBytes != slotBytes)
    return format("%s does not match this rank's shared-memory layout", name.c_str());
  *out = std::move(segment);
  return "";
}

// Every rank learns whether every rank succeeded, and every rank's `flag`;
// throws naming the first rank that did not succeed. Returns whether every
// rank's flag is set.
bool agree(bootstrap::Bootstrap& bootstrap, const std::string& problem, const char* what,
           net::Deadline deadline, bool flag = true) {
  std::vector<uint8_t> state(bootstrap.size(), 0);
  state[bootstrap.rank()] = !problem.empty() ? 0 : flag ? 2 : 1;
  bootstrap.allGather(state.data(), 1, deadline);
  if (!problem.empty())
    throw Error(ErrorCode::SystemError,
                format("braid rank %d: shared memory: %s", bootstrap.rank(), problem.c_str()));
  for (int r = 0; r < bootstrap.size(); ++r)
    if (!state[r])
      throw Error(ErrorCode::RemoteError,
                  format("braid rank %d: shared memory: rank %d could not %s its segment",
                         bootstrap.rank(), r, what));
  return std::all_of(state.begin(), state.end(), [](uint8_t s) { return s == 2; });
}

// After a shrink: the parent's transport whose FIFO data areas this rank's
// connections to `peers` may take over, or null. The parent must be
// retired, must have reached every one of them over shm with FIFOs of this
// shape, and must not have handed its areas over before. The areas are
// mapped and their pages faulted in already, which is most of the cost of
// making them; their stale bytes do no harm, as only the slot headers,
// which are new, say what a slot holds.
ShmTransport* retiredParent(const Setup& setup, const std::vector<int>& peers) {
  const Parent* parent = setup.parent;
  if (!parent || !parent->retired || peers.empty()) return nullptr;
  ShmTransport* found = nullptr;
  for (int peer : peers) {
    const int before = parent->ranks[peer];
    auto* shm = dynamic_cast<ShmTransport*>(parent->wiring.transportOf[before]);
    if (!shm || shm->handedOver_ || (found && shm != found)) return nullptr;
    const ShmConnection* connection = shm->byRank_[before];
    if (connection->slotBytes() != setup.slotBytes ||
        connection->slots() != static_cast<size_t>(setup.slots))
      return nullptr;
    found = shm;
  }
  return found;
}

std::unique_ptr<Transport> create(const Setup& setup, const std::vector<int>& peers, std::string*) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const size_t slotBytes = setup.slotBytes;
  const int slots = setup.slots;
  const size_t fifoBytes = static_cast<size_t>(slots) * slotBytes;
  const net::Deadline deadline = setup.deadline;
  const int rank = bootstrap.rank();
  // Ranks on one host form a group; each member's segment has one FIFO per
  // other member, in rank order.
  std::vector<int> group = peers;
  group.push_back(rank);
  std::sort(group.begin(), group.end());
  const size_t fifos = group.size() - 1;
  const Layout layout(fifos, slots, slotBytes);
  auto fifoIndex = [&](int sender, int receiver) {
    size_t position = std::find(group.begin(), group.end(), sender) - group.begin();
    return sender > receiver ? position - 1 : position;
  };

  auto transport = std::make_unique<ShmTransport>(bootstrap.size());
  const std::string name = segmentName(bootstrap.secret(), rank);
  std::string problem;
  if (!peers.empty())
    problem = createOwn(name, layout, fifos, slots, slotBytes, transport->own_.get(),
                        &transport->probeFd_);
  // The FIFOs take over the parent's data areas where every rank can.
  ShmTransport* parent = retiredParent(setup, peers);
  const bool takeOver = agree(bootstrap, problem, "create", deadline, parent || peers.empty());
  if (!peers.empty())
    problem = reserve(transport->probeFd_, name, takeOver ? layout.data : layout.total);

  transport->peers_.reserve(peers.size());
  for (size_t i = 0; i < peers.size() && problem.empty(); ++i) {
    auto segment = std::make_shared<Segment>();
    problem = mapPeer(segmentName(bootstrap.secret(), peers[i]), layout, fifos, slots, slotBytes,
                      segment.get());
    transport->peers_.push_back(std::move(segment));
  }
  agree(bootstrap, problem, "map", deadline);
  // Everyone mapped everything: the names are no longer needed.
  if (!peers.empty()) ::shm_unlink(name.c_str());

  // References need each receiver to take the sender's memfds with
  // pidfd_getfd(), which the kernel allows only with ptrace rights over the
  // sender. Each rank tries it on every peer's probe fd, and every rank
  // learns the outcome for every pair; after a shrink that takes over the
  // parent's FIFOs, the parent knows it already.
  const int n = bootstrap.size();
  std::vector<uint8_t> mayMap(static_cast<size_t>(n) * n, 0);
  std::vector<int> pidfds(peers.size(), -1);
  for (size_t i = 0; i < peers.size() && !takeOver; ++i) {
    const SegmentHeader* theirs = transport->peers_[i]->header();
    pidfds[i] = static_cast<int>(::syscall(SYS_pidfd_open, theirs->pid, 0));
    if (pidfds[i] < 0) continue;
    const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfds[i], theirs->probeFd, 0));
    if (fd < 0) {
      BRAID_DEBUG(Init, "shm: no references from rank %d: pidfd_getfd: %s", peers[i],
                  std::strerror(errno));
      continue;
    }
    ::close(fd);
    mayMap[static_cast<size_t>(rank) * n + peers[i]] = 1;
  }
  // Messages by address: this rank tells each peer whose memory it can
  // read so, in the control of that peer's FIFO to it; the exchange below
  // publishes it. (After a shrink that takes over the parent's FIFOs, the
  // parent knows it already.)
  for (size_t i = 0; i < peers.size() && !takeOver && setup.knobs.addressBytes != 0; ++i)
    if (readsByAddress(transport->peers_[i]->header(), peers[i]))
      transport->own_->fifo(fifoIndex(peers[i], rank)).control->readsByAddress = 1;
  if (!takeOver) bootstrap.allGather(mayMap.data(), static_cast<size_t>(n), deadline);
  transport->closeProbe();

  for (size_t i = 0; i < peers.size(); ++i) {
    const int peer = peers[i];
    const std::shared_ptr<Segment>& theirs = transport->peers_[i];
    Fifo out = theirs->fifo(fifoIndex(rank, peer));
    Fifo in = transport->own_->fifo(fifoIndex(peer, rank));
    std::shared_ptr<const Segment> outSegment = theirs, inSegment = transport->own_;
    ShmConnection* before = takeOver ? parent->byRank_[setup.parent->ranks[peer]] : nullptr;
    if (before) {
      before->handOver(&out, &in, &outSegment, &inSegment);
    } else {
      prefault(out.data, fifoBytes);
      prefault(in.data, fifoBytes);
    }
    auto connection = std::make_unique<ShmConnection>(peer, out, theirs->header(), in, slotBytes,
                                                      static_cast<size_t>(slots),
                                                      std::move(outSegment), std::move(inSegment));
    if (before) {
      before->handOverReferences(*connection);
    } else {
      connection->allowReferences(pidfds[i], mayMap[static_cast<size_t>(peer) * n + rank] != 0,
                                  mayMap[static_cast<size_t>(rank) * n + peer] != 0);
      connection->allowAddresses(in.control->readsByAddress != 0, out.control->readsByAddress != 0);
    }
    transport->byRank_[peer] = connection.get();
    transport->connections_.push_back(std::move(connection));
  }
  if (takeOver && parent) parent->handedOver_ = true;  // (none: no peers here)
  BRAID_DEBUG(Init, "shm: %zu peers, %zu-byte segment%s", peers.size(), layout.total,
              takeOver ? ", FIFO data taken over from the shrunk communicator" : "");
  return transport;
}

}  // namespace

TransportEntry entry() {
  TransportEntry entry("shm", Reach::SameHost,
                       "a FIFO per peer in POSIX shared memory, ranks on one host");
  entry.create = create;
  entry.byAddress = true;
  entry.hostLink = tuning::hostLinkModel(0.15e-6, 12e9);  // the sender's copy into the FIFO
  return entry;
}

}  // namespace braid::transport::shm
