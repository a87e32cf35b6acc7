// The fake fabric (fake_fabric.h). Its shared memory:
//
// Every open device is a node: a memfd named "braid-fabric:<fabric>",
// which a peer finds by listing /proc/<pid>/fd for the pid in the GID and
// opens through /proc/<pid>/fd/<n>. It holds a header (magic, pid,
// layout), a QP table (per QP: number, state, receive ring and receive
// CQ), an MR table (per key: the registered range, its access and the
// target block or dma-buf file behind it) and an arena for CQ rings and
// receive rings. Every allocateTarget() block is a memfd of its own, a
// header page and then the memory, which peers map whole (and cache) on
// first use. A dma-buf region is the caller's file, with no header: the
// fake holds a dup of its fd, and peers map the registered range of it.
//
// Other processes write only to atomics on lock-free types there, and to
// a CQ slot's payload between claiming and publishing it (release/acquire
// on the slot's word). A CQ ring is multi-producer, single-consumer; a
// producer claims a slot by writing its pid into the slot's word, so the
// consumer can step over a slot whose producer died before publishing.
//
// The handle types of verbs_backend.h are never defined here (another
// backend may define them in the same binary): the fake's own types are
// reinterpret_cast to and from them.
#include "transports/ibverbs/fake_fabric.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/errors.h"

namespace braid::transport::ibverbs {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the fake fabric shares atomics between processes");

constexpr uint64_t kNodeMagic = 0x65646f4e6b614642ull;
constexpr uint64_t kBlockMagic = 0x6b636f6c426b6142ull;
constexpr uint32_t kLayoutVersion = 2;
constexpr uint32_t kMaxQps = 1024;
constexpr uint32_t kMaxMrs = 1u << 16;                 // keys are slot << 8 | generation
constexpr uint64_t kArenaBytes = uint64_t{256} << 20;  // sparse: only what is used is touched
constexpr int kMaxQpWr = 16384;
constexpr int kMaxCqe = 65536;
constexpr int kMaxInline = 256;
constexpr int kGidTableLength = 4;
constexpr size_t kMaxFabricName = 200;
constexpr uint32_t kCorruptKeyBit = 0x80000000u;  // never set in a key handed out
constexpr char kNodeName[] = "braid-fabric:";
constexpr char kBlockName[] = "braid-fabric-target";
constexpr auto kLivenessInterval = std::chrono::milliseconds(1);
constexpr auto kMaxRetryWait = std::chrono::seconds(10);
constexpr auto kStalledSlot = std::chrono::milliseconds(10);
constexpr auto kWaitingPoll = std::chrono::milliseconds(1);
constexpr int kEventCqErr = 0;  // ibv_event_type numbers
constexpr int kEventQpFatal = 1;

// ------------------------------------------------------------ shared layout

struct NodeHeader {
  std::atomic<uint64_t> magic;  // kNodeMagic once set up, 0 once closed
  uint32_t version;
  int32_t pid;
  uint64_t nodeId;
  uint64_t bytes;
  uint64_t qpTable, mrTable, arena;  // offsets in the node
  uint32_t maxQps, maxMrs;
  char fabric[kMaxFabricName + 1];
};

enum class QpState : uint32_t { Reset, Init, Rtr, Rts, Error };

struct alignas(64) SharedQp {
  std::atomic<uint32_t> qpNum;             // 0: free; published last
  std::atomic<uint32_t> state;             // QpState
  std::atomic<uint32_t> broken;            // a writer overran this QP's receive CQ
  std::atomic<uint32_t> recvCapacity;      // a power of two
  std::atomic<uint64_t> recvRing, recvCq;  // offsets in the node
  std::atomic<uint64_t> recvPosted;        // by the owner
  std::atomic<uint64_t> recvConsumed;      // by CAS: the writer, or the owner flushing
};

// What a region's memory is, for a peer that wants to reach it.
enum class BlockKind : uint32_t {
  None,    // plain memory of the owner: no peer reaches it
  Target,  // in an allocateTarget() block
  Dmabuf,  // a registerDmabuf() file
};

// A seqlock keyed by `key`: the owner clears it before changing the fields
// and sets it last; a reader trusts the fields only if it reads the same
// key before and after them.
struct alignas(64) SharedMr {
  std::atomic<uint32_t> key;  // 0: free; lkey and rkey alike
  std::atomic<uint32_t> access;
  std::atomic<int32_t> blockFd;  // in the owner: the block's memfd or the dma-buf's dup; -1: none
  std::atomic<uint32_t> kind;    // BlockKind
  std::atomic<uint64_t> address, length;
  // Target: the block's id and first byte in the owner. Dmabuf: an id of
  // this registration alone, and `address`.
  std::atomic<uint64_t> blockId, blockAddress;
  std::atomic<uint64_t> fileOffset;  // Dmabuf: where blockAddress lies in the file
  std::atomic<uint64_t> inode;       // Dmabuf: the file's, which a peer checks on opening it
};
static_assert(sizeof(SharedMr) == 64, "the MR table holds a cache line per key");

struct alignas(64) CqShared {
  std::atomic<uint64_t> tail;       // the next ticket; may lag behind a claim (others help it on)
  std::atomic<uint64_t> capacity;   // a power of two
  std::atomic<uint32_t> futexWord;  // bumped after every push
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> overrun;
};

// A slot's word: ticket (40 bits) | producer pid (22 bits) | state (2 bits).
// Free for ticket t, claimed for t by a pid, published for t; the consumer
// frees it for t + capacity.
constexpr uint64_t kTicketMask = (uint64_t{1} << 40) - 1;
enum : uint64_t { kFree = 0, kClaimed = 1, kPublished = 2 };
uint64_t slotWord(uint64_t ticket, uint32_t pid, uint64_t state) {
  return (ticket & kTicketMask) << 24 | (uint64_t{pid} & 0x3fffff) << 2 | state;
}
uint64_t ticketOf(uint64_t word) { return word >> 24; }
uint32_t pidOf(uint64_t word) { return static_cast<uint32_t>(word >> 2) & 0x3fffff; }
uint64_t stateOf(uint64_t word) { return word & 3; }

struct alignas(64) CqSlot {
  std::atomic<uint64_t> word;
  uint64_t wrId;
  uint64_t sqIndex;  // a send completion's WR, for retiring send slots
  uint32_t status, opcode, bytes, imm, qpNum, qpSlot;
  uint32_t recv;  // 1: a receive completion
};

struct BlockHeader {
  std::atomic<uint64_t> magic;
  uint64_t id;
  uint64_t bytes;
  uint64_t dataOffset;
  std::atomic<uint32_t> released;
};

struct Entry {
  uint64_t wrId, sqIndex;
  WcStatus status;
  Opcode opcode;
  uint32_t bytes, imm, qpNum, qpSlot;
  bool recv;
};

// ------------------------------------------------------------ system bits

uint64_t roundUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }
uint64_t pow2AtLeast(uint64_t value) {
  uint64_t p = 1;
  while (p < value) p <<= 1;
  return p;
}
bool within(uint64_t at, uint64_t bytes, uint64_t begin, uint64_t length) {
  return at >= begin && at - begin <= length && bytes <= length - (at - begin);
}

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

// ------------------------------------------------------------ GIDs

// Index 0: fe80::0000:00ff:fe<pid>, the EUI-64 of MAC 02:00:00:<pid>;
// index 1: ::ffff:10.<pid>. Pids are below 2^22, so 24 bits hold them.
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

// ------------------------------------------------------------ process state

struct Block {
  uint8_t* data;
  int fd;
  uint64_t id;
  uint64_t bytes;
  uint8_t* mapping;
  uint64_t mapBytes;
  const void* backend;  // the one that frees it if nobody releases it
};

// Shared by the backends of one process; the mutex guards `blocks` only.
struct ProcessState {
  std::mutex mutex;
  std::map<uintptr_t, Block> blocks;  // by their first byte
  std::atomic<uint32_t> qpNums{0};
  std::atomic<uint64_t> ids{0};
  std::atomic<uint64_t> faultCount{0};  // send WRs of backends with a fault spec
};
ProcessState& processState() {
  // Never destroyed: a backend may outlive static destruction.
  static ProcessState* state = [] {
    auto* created = new ProcessState;
    pthread_atfork(nullptr, nullptr, [] { processState().faultCount.store(0); });
    return created;
  }();
  return *state;
}
uint64_t newId() {
  return uint64_t(static_cast<uint32_t>(getpid())) << 32 | (processState().ids.fetch_add(1) + 1);
}

// First-fit ranges of a node's arena, in the owner's private memory.
class Arena {
 public:
  void reset(uint64_t begin, uint64_t bytes) { free_ = {{begin, bytes}}; }
  uint64_t take(uint64_t bytes) {  // 0: full
    bytes = roundUp(bytes, 64);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const uint64_t at = it->first, rest = it->second - bytes;
      free_.erase(it);
      if (rest > 0) free_[at + bytes] = rest;
      return at;
    }
    return 0;
  }
  void give(uint64_t at, uint64_t bytes) {
    bytes = roundUp(bytes, 64);
    auto next = free_.lower_bound(at);
    if (next != free_.end() && at + bytes == next->first) {
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += bytes;
        return;
      }
    }
    free_[at] = bytes;
  }

 private:
  std::map<uint64_t, uint64_t> free_;
};

// ------------------------------------------------------------ the handles

// Another process's node (or this process's, for a QP connected within it).
struct PeerNode {
  int pid = 0;
  int pidfd = -1;
  bool self = false;
  bool gone = false;
  uint64_t nodeId = 0;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  NodeHeader* header = nullptr;
  SharedQp* qps = nullptr;
  SharedMr* mrs = nullptr;
  uint32_t maxQps = 0, maxMrs = 0;
  Clock::time_point nextCheck{};
  int users = 0;  // QPs connected to it
};

// A peer's target block or dma-buf region, mapped here. `data` is the
// byte at the peer's blockAddress.
struct RemoteBlock {
  uint8_t* mapping;
  uint64_t mapBytes;
  uint8_t* data;
  uint64_t bytes;
  BlockHeader* header;  // nullptr for a dma-buf region, which has none
  uint64_t nodeId;      // a dma-buf region's: unmapped once this key is gone from that node
  uint32_t slot, key;
};

// A region's SharedMr as a reader found it under its key, or as its
// owner publishes it.
struct MrRecord {
  uint32_t slot = 0, key = 0, access = 0;
  BlockKind kind = BlockKind::None;
  int blockFd = -1;
  uint64_t address = 0, length = 0, blockId = 0, blockAddress = 0, fileOffset = 0, inode = 0;
};

struct FakeQp;
struct FakeCq;
struct FakeDevice;
struct FakePd {
  FakeDevice* device;
};
struct FakeMr {
  FakeDevice* device;
  uint32_t slot;
  int dmabufFd;  // the fake's dup of a dma-buf region's fd; -1 for other regions
};

struct FakeDevice {
  std::string fabric;
  int pid = 0;
  int memfd = -1;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  NodeHeader* header = nullptr;
  SharedQp* sharedQps = nullptr;
  SharedMr* sharedMrs = nullptr;
  std::vector<uint8_t> mrGenerations = std::vector<uint8_t>(kMaxMrs);  // by slot
  Arena arena;
  std::vector<FakeQp*> qps = std::vector<FakeQp*>(kMaxQps);  // by slot
  uint32_t nextQpSlot = 0, nextMrSlot = 0;  // slots go round, so a freed one rests a while
  std::set<FakePd*> pds;
  std::set<FakeCq*> cqs;
  std::set<FakeMr*> mrs;
  std::deque<AsyncEvent> events;
  std::vector<std::unique_ptr<PeerNode>> peers;
  std::unordered_map<uint64_t, RemoteBlock> blocks;  // peers' target blocks, by id
  std::vector<FakeQp*> waiting;                      // QPs with WRs not yet executed
};

struct FakeCq {
  FakeDevice* device;
  uint64_t offset, arenaBytes;
  CqShared* shared;
  CqSlot* slots;
  uint64_t capacity, mask;
  uint64_t head = 0;  // the consumer's alone
  int users = 0;
  bool overrunHandled = false;
  uint64_t stalledTicket = ~uint64_t{0};
  Clock::time_point stalledSince{};
};

enum : uint8_t { kNoFault, kFaultRetry, kFaultRkey, kFaultFlush };

struct FakeQp {
  FakeDevice* device;
  uint32_t qpNum, slot;
  SharedQp* shared;
  FakeCq* sendCq;
  FakeCq* recvCq;
  QpCaps caps;
  QpState state = QpState::Reset;
  // Send queue: WR i in slot i % sendDepth; [retired, posted) hold slots,
  // [executed, posted) wait for their peer.
  std::vector<SendRequest> sq;
  std::vector<uint8_t> faults;
  std::vector<uint8_t> inlineBytes;  // maxInline per slot
  uint64_t posted = 0, executed = 0, retired = 0;
  // Receive queue, in the node: [recvRetired, recvPosted) hold slots.
  std::atomic<uint64_t>* recvRing;
  uint64_t recvMask, recvRingOffset, recvRingBytes;
  uint64_t recvPosted = 0, recvRetired = 0;
  // The peer, from RTR on.
  PeerNode* peer = nullptr;
  SharedQp* remote = nullptr;
  uint32_t remoteQpNum = 0, remoteSlot = 0;
  std::atomic<uint64_t>* remoteRing = nullptr;
  uint64_t remoteRingMask = 0;
  CqShared* remoteCq = nullptr;
  CqSlot* remoteSlots = nullptr;
  Clock::duration retryWait = kMaxRetryWait;
  bool stalled = false;  // the WR at `executed` waits for the peer to reach RTR
  Clock::time_point stalledSince{};
  bool listed = false;  // in device->waiting
  bool fatalReported = false;
};

template <typename To, typename From>
To* as(From* handle) {
  return reinterpret_cast<To*>(handle);
}

const char* stateName(QpState state) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "ERROR"};
  return names[static_cast<int>(state)];
}

struct Fault {
  uint8_t kind = kNoFault;
  uint64_t at = 0;
};
Fault parseFault(const std::string& spec) {
  Fault fault;
  if (spec.empty()) return fault;
  const size_t at = spec.find('@');
  const std::string kind = spec.substr(0, at),
                    number = at == std::string::npos ? "" : spec.substr(at + 1);
  if (kind == "retry") fault.kind = kFaultRetry;
  if (kind == "rkey") fault.kind = kFaultRkey;
  if (kind == "flush") fault.kind = kFaultFlush;
  const bool digits = !number.empty() && number.size() <= 18 &&
                      number.find_first_not_of("0123456789") == std::string::npos;
  if (digits) fault.at = std::stoull(number);
  if (fault.kind == kNoFault || fault.at == 0) {
    throw Error(ErrorCode::InvalidArgument,
                format("BRAID_IB_FAKE_FAULT '%s': expected retry@N, rkey@N or flush@N with N >= 1",
                       spec.c_str()));
  }
  return fault;
}

// ------------------------------------------------------------ CQ rings

void wake(CqShared* cq) {
  cq->futexWord.fetch_add(1, std::memory_order_seq_cst);
  if (cq->waiters.load(std::memory_order_seq_cst) != 0) futexWake(&cq->futexWord);
}

// Claims the next slot of the ring, fills and publishes it. False when the
// ring is full: then it is marked overrun and the completion is lost.
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

bool mayHold(const FakeCq* cq) {
  return cq->slots[cq->head & cq->mask].word.load(std::memory_order_acquire) !=
             slotWord(cq->head, 0, kFree) ||
         (!cq->overrunHandled && cq->shared->overrun.load(std::memory_order_acquire) != 0);
}

// ------------------------------------------------------------ the backend

class FakeFabric final : public VerbsBackend {
 public:
  FakeFabric(std::string fabric, Fault fault) : fabric_(std::move(fabric)), fault_(fault) {}
  ~FakeFabric() override;

  std::string describe() const override { return format("fake fabric '%s'", fabric_.c_str()); }
  std::vector<std::string> deviceNames() override { return {"fake_0"}; }
  Device* openDevice(const std::string& name, DeviceInfo* info) override;
  void closeDevice(Device* device) override;
  PortInfo queryPort(Device* device, int port) override;
  Gid queryGid(Device* device, int port, int index) override;

  ProtectionDomain* allocPd(Device* device) override;
  void deallocPd(ProtectionDomain* pd) override;

  void* allocateTarget(size_t bytes) override;
  void releaseTarget(void* memory, size_t bytes) override;
  MemoryRegion* registerMemory(ProtectionDomain* pd, void* address, size_t bytes, int access,
                               Keys* keys) override;
  MemoryRegion* registerDmabuf(ProtectionDomain* pd, int fd, uint64_t offset, size_t bytes,
                               uint64_t address, int access, Keys* keys) override;
  void deregister(MemoryRegion* region) override;

  CompletionQueue* createCq(Device* device, int depth) override;
  void destroyCq(CompletionQueue* cq) override;
  int pollCq(CompletionQueue* cq, Completion* out, int max) override;
  void waitCq(CompletionQueue* cq, Clock::time_point until) override;

  QueuePair* createQp(ProtectionDomain* pd, CompletionQueue* sendCq, CompletionQueue* recvCq,
                      const QpCaps& caps, uint32_t* qpNum) override;
  void destroyQp(QueuePair* qp) override;
  void toInit(QueuePair* qp, const PathOptions& path) override;
  void toRtr(QueuePair* qp, const RemoteQp& remote, const PathOptions& path) override;
  void toRts(QueuePair* qp, const PathOptions& path) override;

  int postSend(QueuePair* qp, const SendRequest* requests, size_t count) override;
  int postRecv(QueuePair* qp, const RecvRequest* requests, size_t count) override;
  bool nextAsyncEvent(Device* device, AsyncEvent* event) override;

 private:
  [[noreturn]] void fail(const char* what, const std::string& why) const {
    throw Error(ErrorCode::SystemError,
                format("fake fabric '%s': %s: %s", fabric_.c_str(), what, why.c_str()));
  }
  void checkStep(const FakeQp* qp, const char* step, QpState needed) const;

  bool execute(FakeQp* qp, uint64_t index);
  void advance(FakeQp* qp);
  void advanceWaiting(FakeDevice* d);
  void complete(FakeQp* qp, uint64_t index, WcStatus status);
  void enterError(FakeQp* qp);
  void flushReceives(FakeQp* qp);
  void overrun(FakeCq* cq);
  void freeCq(FakeCq* cq);
  bool claimReceive(FakeQp* qp, uint64_t* wrId);
  bool resolveRemote(FakeQp* qp, uint32_t rkey, uint64_t address, uint32_t bytes, int access,
                     uint8_t** out);
  FakeMr* publishMr(FakeDevice* d, const MrRecord& record, Keys* keys);
  RemoteBlock* mapBlock(FakeDevice* d, const PeerNode* peer, const MrRecord& m);
  void sweepBlocks(FakeDevice* d);
  PeerNode* mapNode(FakeDevice* d, int pid, const std::string& path);
  PeerNode* findQp(FakeDevice* d, int pid, uint32_t qpNum, SharedQp** found);
  void retire(FakeDevice* d, const CqSlot& slot);
  bool skipDeadProducer(FakeCq* cq, uint64_t word);

  const std::string fabric_;
  const Fault fault_;
  std::set<FakeDevice*> devices_;
};

// Frees what the engine left open; never throws (the CQs go without the
// check destroyCq makes, their QPs having gone first).
FakeFabric::~FakeFabric() {
  try {
    while (!devices_.empty()) closeDevice(as<Device>(*devices_.begin()));
    std::vector<std::pair<void*, uint64_t>> left;
    {
      std::lock_guard<std::mutex> lock(processState().mutex);
      for (auto& [address, block] : processState().blocks) {
        if (block.backend == this) left.emplace_back(block.data, block.bytes);
      }
    }
    for (auto& [memory, bytes] : left) releaseTarget(memory, bytes);
  } catch (...) {  // only allocation can fail here; leaking then is all there is to do
  }
}

// ------------------------------------------------------------ devices

Device* FakeFabric::openDevice(const std::string& name, DeviceInfo* info) {
  if (name != "fake_0")
    fail("openDevice", format("no device '%s' (there is fake_0)", name.c_str()));
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t qpTable = roundUp(sizeof(NodeHeader), page);
  const uint64_t mrTable = qpTable + roundUp(kMaxQps * sizeof(SharedQp), page);
  const uint64_t arena = mrTable + roundUp(kMaxMrs * sizeof(SharedMr), page);
  const uint64_t bytes = arena + kArenaBytes;

  const int fd = memfd_create((kNodeName + fabric_).c_str(), MFD_CLOEXEC);
  if (fd < 0) fail("openDevice", format("memfd_create: %s", std::strerror(errno)));
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    fail("openDevice", format("mapping %llu bytes of shared memory: %s",
                              static_cast<unsigned long long>(bytes), std::strerror(err)));
  }
  auto* d = new FakeDevice;
  d->fabric = fabric_, d->pid = getpid(), d->memfd = fd, d->bytes = bytes;
  d->base = static_cast<uint8_t*>(base);
  d->header = reinterpret_cast<NodeHeader*>(d->base);
  d->sharedQps = reinterpret_cast<SharedQp*>(d->base + qpTable);
  d->sharedMrs = reinterpret_cast<SharedMr*>(d->base + mrTable);
  d->arena.reset(arena, kArenaBytes);
  NodeHeader* h = d->header;
  h->version = kLayoutVersion, h->pid = d->pid, h->nodeId = newId(), h->bytes = bytes;
  h->qpTable = qpTable, h->mrTable = mrTable, h->arena = arena;
  h->maxQps = kMaxQps, h->maxMrs = kMaxMrs;
  std::snprintf(h->fabric, sizeof h->fabric, "%s", fabric_.c_str());
  h->magic.store(kNodeMagic, std::memory_order_release);
  devices_.insert(d);
  if (info != nullptr) {
    info->name = "fake_0", info->ports = 1, info->maxQpWr = kMaxQpWr, info->maxCqe = kMaxCqe;
    info->maxMrSize = uint64_t{1} << 40;
  }
  return as<Device>(d);
}

void FakeFabric::closeDevice(Device* device) {
  FakeDevice* d = as<FakeDevice>(device);
  for (FakeQp* qp : d->qps) {
    if (qp != nullptr) destroyQp(as<QueuePair>(qp));
  }
  while (!d->cqs.empty()) freeCq(*d->cqs.begin());
  while (!d->mrs.empty()) deregister(as<MemoryRegion>(*d->mrs.begin()));
  for (FakePd* pd : d->pds) delete pd;
  for (auto& peer : d->peers) {
    munmap(peer->base, peer->bytes);
    if (peer->pidfd >= 0) close(peer->pidfd);
  }
  for (auto& [id, block] : d->blocks) munmap(block.mapping, block.mapBytes);
  d->header->magic.store(0, std::memory_order_release);
  munmap(d->base, d->bytes);
  close(d->memfd);
  devices_.erase(d);
  delete d;
}

PortInfo FakeFabric::queryPort(Device*, int port) {
  if (port != 1) fail("queryPort", format("port %d: fake_0 has port 1 only", port));
  PortInfo info;
  info.state = PortState::Active, info.linkLayer = LinkLayer::Ethernet, info.lid = 0;
  info.activeMtu = 4096, info.gidTableLength = kGidTableLength;
  return info;
}

Gid FakeFabric::queryGid(Device* device, int port, int index) {
  if (port != 1) fail("queryGid", format("port %d: fake_0 has port 1 only", port));
  if (index < 0 || index >= kGidTableLength) {
    fail("queryGid", format("index %d outside the table of %d", index, kGidTableLength));
  }
  return makeGid(index, as<FakeDevice>(device)->pid);
}

bool FakeFabric::nextAsyncEvent(Device* device, AsyncEvent* event) {
  FakeDevice* d = as<FakeDevice>(device);
  if (d->events.empty()) return false;
  *event = d->events.front();
  d->events.pop_front();
  return true;
}

ProtectionDomain* FakeFabric::allocPd(Device* device) {
  auto* pd = new FakePd{as<FakeDevice>(device)};
  pd->device->pds.insert(pd);
  return as<ProtectionDomain>(pd);
}

void FakeFabric::deallocPd(ProtectionDomain* handle) {
  FakePd* pd = as<FakePd>(handle);
  pd->device->pds.erase(pd);
  delete pd;
}

// ------------------------------------------------------------ memory

void* FakeFabric::allocateTarget(size_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t data = roundUp(std::max<uint64_t>(bytes, 1), page);
  const int fd = memfd_create(kBlockName, MFD_CLOEXEC);
  if (fd < 0) fail("allocateTarget", format("memfd_create: %s", std::strerror(errno)));
  void* mapping = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(page + data)) == 0) {
    mapping = mmap(nullptr, page + data, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mapping == MAP_FAILED) {
    const int err = errno;
    close(fd);
    fail("allocateTarget", format("%zu bytes: %s", bytes, std::strerror(err)));
  }
  auto* header = static_cast<BlockHeader*>(mapping);
  header->id = newId(), header->bytes = data, header->dataOffset = page;
  header->magic.store(kBlockMagic, std::memory_order_release);
  uint8_t* memory = static_cast<uint8_t*>(mapping) + page;
  std::lock_guard<std::mutex> lock(processState().mutex);
  processState().blocks[reinterpret_cast<uintptr_t>(memory)] =
      Block{memory, fd, header->id, data, static_cast<uint8_t*>(mapping), page + data, this};
  return memory;
}

void FakeFabric::releaseTarget(void* memory, size_t) {
  Block block;
  {
    std::lock_guard<std::mutex> lock(processState().mutex);
    auto it = processState().blocks.find(reinterpret_cast<uintptr_t>(memory));
    if (it == processState().blocks.end()) {
      throw Error(ErrorCode::InvalidArgument,
                  format("fake fabric '%s': releaseTarget: %p is not from allocateTarget()",
                         fabric_.c_str(), memory));
    }
    block = it->second;
    processState().blocks.erase(it);
  }
  reinterpret_cast<BlockHeader*>(block.mapping)->released.store(1, std::memory_order_release);
  munmap(block.mapping, block.mapBytes);
  close(block.fd);
}

MemoryRegion* FakeFabric::registerMemory(ProtectionDomain* pd, void* address, size_t bytes,
                                         int access, Keys* keys) {
  FakeDevice* d = as<FakePd>(pd)->device;
  if ((access & kRemoteWrite) != 0 && (access & kLocalWrite) == 0) {
    fail("registerMemory", "remote write access needs local write (EINVAL)");
  }
  MrRecord r;
  r.access = static_cast<uint32_t>(access);
  r.address = reinterpret_cast<uintptr_t>(address), r.length = bytes;
  {
    std::lock_guard<std::mutex> lock(processState().mutex);
    auto& blocks = processState().blocks;
    auto it = blocks.upper_bound(r.address);
    if (it != blocks.begin() &&
        within(r.address, bytes, std::prev(it)->first, std::prev(it)->second.bytes)) {
      --it;
      r.kind = BlockKind::Target, r.blockFd = it->second.fd;
      r.blockId = it->second.id, r.blockAddress = it->first;
    }
  }
  FakeMr* mr = publishMr(d, r, keys);
  if (mr == nullptr) fail("registerMemory", format("all %u keys are taken", kMaxMrs));
  return as<MemoryRegion>(mr);
}

// Hardware's rules as far as the fake can check them (mlx5 wants `offset`
// and `address` at the same place in a page); nullptr, as libibverbs
// gives, for the rest. Whether `address` really maps the file here is
// the caller's word: local SGEs use it as it is.
MemoryRegion* FakeFabric::registerDmabuf(ProtectionDomain* pd, int fd, uint64_t offset,
                                         size_t bytes, uint64_t address, int access, Keys* keys) {
  FakeDevice* d = as<FakePd>(pd)->device;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if ((access & kRemoteWrite) != 0 && (access & kLocalWrite) == 0) return nullptr;  // EINVAL
  if (((offset ^ address) & (page - 1)) != 0 || address + bytes < address) return nullptr;
  const int own = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return nullptr;
  struct stat st {};
  if (fstat(own, &st) != 0 || !S_ISREG(st.st_mode) || offset > static_cast<uint64_t>(st.st_size) ||
      bytes > static_cast<uint64_t>(st.st_size) - offset) {
    close(own);  // not a file, or the range lies beyond it
    return nullptr;
  }
  MrRecord r;
  r.access = static_cast<uint32_t>(access), r.kind = BlockKind::Dmabuf, r.blockFd = own;
  r.address = address, r.length = bytes;
  r.blockId = newId(), r.blockAddress = address;  // a fresh id: no peer has a mapping of it
  r.fileOffset = offset, r.inode = static_cast<uint64_t>(st.st_ino);
  FakeMr* mr = publishMr(d, r, keys);
  if (mr == nullptr) {
    close(own);  // all keys are taken
    return nullptr;
  }
  mr->dmabufFd = own;
  return as<MemoryRegion>(mr);
}

// Publishes `record` (its slot and key aside) under a fresh key in a free
// slot; nullptr when all are taken.
FakeMr* FakeFabric::publishMr(FakeDevice* d, const MrRecord& r, Keys* keys) {
  uint32_t slot = kMaxMrs;
  for (uint32_t n = 0; n < kMaxMrs && slot == kMaxMrs; ++n) {
    const uint32_t s = (d->nextMrSlot + n) % kMaxMrs;
    if (d->sharedMrs[s].key.load(std::memory_order_relaxed) == 0) slot = s;
  }
  if (slot == kMaxMrs) return nullptr;
  d->nextMrSlot = slot + 1;
  SharedMr& m = d->sharedMrs[slot];
  const uint32_t generation = d->mrGenerations[slot] % 255u + 1;
  d->mrGenerations[slot] = static_cast<uint8_t>(generation);
  const uint32_t key = slot << 8 | generation;
  // Release stores: a reader that sees any new field also sees the key
  // cleared (or the new key), never the old one.
  m.access.store(r.access, std::memory_order_release);
  m.blockFd.store(r.blockFd, std::memory_order_release);
  m.kind.store(static_cast<uint32_t>(r.kind), std::memory_order_release);
  m.address.store(r.address, std::memory_order_release);
  m.length.store(r.length, std::memory_order_release);
  m.blockId.store(r.blockId, std::memory_order_release);
  m.blockAddress.store(r.blockAddress, std::memory_order_release);
  m.fileOffset.store(r.fileOffset, std::memory_order_release);
  m.inode.store(r.inode, std::memory_order_release);
  m.key.store(key, std::memory_order_release);
  keys->lkey = keys->rkey = key;
  auto* mr = new FakeMr{d, slot, -1};
  d->mrs.insert(mr);
  return mr;
}

// A dma-buf region's dup closes after its key is cleared: a peer that
// opened the descriptor and still finds the key opened this region's file.
void FakeFabric::deregister(MemoryRegion* region) {
  FakeMr* mr = as<FakeMr>(region);
  mr->device->sharedMrs[mr->slot].key.store(0, std::memory_order_seq_cst);
  if (mr->dmabufFd >= 0) close(mr->dmabufFd);
  mr->device->mrs.erase(mr);
  delete mr;
}

// ------------------------------------------------------------ CQs

CompletionQueue* FakeFabric::createCq(Device* device, int depth) {
  FakeDevice* d = as<FakeDevice>(device);
  if (depth < 1 || depth > kMaxCqe) {
    fail("createCq", format("depth %d outside 1..%d (EINVAL)", depth, kMaxCqe));
  }
  const uint64_t capacity = pow2AtLeast(static_cast<uint64_t>(depth));
  const uint64_t bytes = sizeof(CqShared) + capacity * sizeof(CqSlot);
  const uint64_t offset = d->arena.take(bytes);
  if (offset == 0) fail("createCq", "the device's shared arena is full (ENOMEM)");
  std::memset(d->base + offset, 0, bytes);  // nobody else sees it before a QP names it
  auto* cq = new FakeCq;
  cq->device = d, cq->offset = offset, cq->arenaBytes = bytes;
  cq->shared = reinterpret_cast<CqShared*>(d->base + offset);
  cq->slots = reinterpret_cast<CqSlot*>(cq->shared + 1);
  cq->capacity = capacity, cq->mask = capacity - 1;
  cq->shared->capacity.store(capacity, std::memory_order_relaxed);
  for (uint64_t i = 0; i < capacity; ++i) {
    cq->slots[i].word.store(slotWord(i, 0, kFree), std::memory_order_relaxed);
  }
  d->cqs.insert(cq);
  return as<CompletionQueue>(cq);
}

void FakeFabric::destroyCq(CompletionQueue* handle) {
  FakeCq* cq = as<FakeCq>(handle);
  if (cq->users > 0) {
    fail("destroyCq",
         format("%d send or receive queues of QPs still use the CQ (EBUSY)", cq->users));
  }
  freeCq(cq);
}

void FakeFabric::freeCq(FakeCq* cq) {
  cq->device->arena.give(cq->offset, cq->arenaBytes);
  cq->device->cqs.erase(cq);
  delete cq;
}

// Frees the send or receive slots a polled completion stands for.
void FakeFabric::retire(FakeDevice* d, const CqSlot& slot) {
  if (slot.qpSlot >= kMaxQps) return;
  FakeQp* qp = d->qps[slot.qpSlot];
  if (qp == nullptr || qp->qpNum != slot.qpNum) return;  // destroyed since
  if (slot.recv != 0) {
    ++qp->recvRetired;
  } else {
    qp->retired = std::max(qp->retired, slot.sqIndex + 1);
  }
}

// A slot claimed but not published for kStalledSlot whose claimer has
// died is freed, or its CQ would never deliver another completion.
bool FakeFabric::skipDeadProducer(FakeCq* cq, uint64_t word) {
  if (stateOf(word) != kClaimed || ticketOf(word) != (cq->head & kTicketMask)) return false;
  const Clock::time_point now = Clock::now();
  if (cq->stalledTicket != cq->head) {
    cq->stalledTicket = cq->head, cq->stalledSince = now;
    return false;
  }
  if (now - cq->stalledSince < kStalledSlot) return false;
  cq->stalledSince = now;
  const int pid = static_cast<int>(pidOf(word));
  if (pid == cq->device->pid || !processGone(pid)) return false;
  if (!cq->slots[cq->head & cq->mask].word.compare_exchange_strong(
          word, slotWord(cq->head + cq->capacity, 0, kFree), std::memory_order_acq_rel)) {
    return false;
  }
  ++cq->head;
  return true;
}

// Hot path: no allocation, no system call.
int FakeFabric::pollCq(CompletionQueue* handle, Completion* out, int max) {
  FakeCq* cq = as<FakeCq>(handle);
  FakeDevice* d = cq->device;
  if (!d->waiting.empty()) advanceWaiting(d);
  int n = 0;
  while (n < max) {
    CqSlot& s = cq->slots[cq->head & cq->mask];
    const uint64_t word = s.word.load(std::memory_order_acquire);
    if (word != slotWord(cq->head, 0, kPublished)) {
      if (skipDeadProducer(cq, word)) continue;
      break;
    }
    Completion& c = out[n++];
    c.wrId = s.wrId, c.status = static_cast<WcStatus>(s.status);
    c.opcode = static_cast<Opcode>(s.opcode), c.bytes = s.bytes, c.imm = s.imm;
    c.qpNum = s.qpNum, c.vendorError = 0;
    retire(d, s);
    s.word.store(slotWord(cq->head + cq->capacity, 0, kFree), std::memory_order_release);
    ++cq->head;
  }
  if (!cq->overrunHandled && cq->shared->overrun.load(std::memory_order_acquire) != 0) overrun(cq);
  return n;
}

void FakeFabric::waitCq(CompletionQueue* handle, Clock::time_point until) {
  FakeCq* cq = as<FakeCq>(handle);
  FakeDevice* d = cq->device;
  if (!d->waiting.empty()) {
    advanceWaiting(d);  // WRs waiting for a peer: look again soon
    until = std::min(until, Clock::now() + kWaitingPoll);
  }
  // Producers bump futexWord after publishing and wake only if there are
  // waiters; counting ourselves first and reading the word before looking
  // at the ring means a push in between changes the word and FUTEX_WAIT
  // returns at once.
  CqShared* s = cq->shared;
  s->waiters.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t word = s->futexWord.load(std::memory_order_seq_cst);
  const Clock::time_point now = Clock::now();
  if (!mayHold(cq) && now < until) futexWait(&s->futexWord, word, until - now);
  s->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

// A full CQ loses completions: like hardware, the CQ reports CqError and
// every QP on it goes to ERROR.
void FakeFabric::overrun(FakeCq* cq) {
  if (cq->overrunHandled) return;
  cq->overrunHandled = true;
  cq->shared->overrun.store(1, std::memory_order_release);
  FakeDevice* d = cq->device;
  AsyncEvent event;
  event.kind = AsyncEventKind::CqError, event.code = kEventCqErr;
  d->events.push_back(event);
  for (FakeQp* qp : d->qps) {
    if (qp != nullptr && (qp->sendCq == cq || qp->recvCq == cq)) enterError(qp);
  }
}

// ------------------------------------------------------------ QPs

QueuePair* FakeFabric::createQp(ProtectionDomain* pd, CompletionQueue* sendCq,
                                CompletionQueue* recvCq, const QpCaps& caps, uint32_t* qpNum) {
  FakeDevice* d = as<FakePd>(pd)->device;
  if (caps.sendDepth < 1 || caps.sendDepth > kMaxQpWr || caps.recvDepth < 0 ||
      caps.recvDepth > kMaxQpWr || caps.maxInline < 0 || caps.maxInline > kMaxInline) {
    fail("createQp",
         format("send depth %d, receive depth %d, inline %d: beyond 1..%d, 0..%d, 0..%d "
                "(EINVAL)",
                caps.sendDepth, caps.recvDepth, caps.maxInline, kMaxQpWr, kMaxQpWr, kMaxInline));
  }
  uint32_t slot = kMaxQps;
  for (uint32_t n = 0; n < kMaxQps && slot == kMaxQps; ++n) {
    const uint32_t s = (d->nextQpSlot + n) % kMaxQps;
    if (d->qps[s] == nullptr) slot = s;
  }
  if (slot == kMaxQps) fail("createQp", format("all %u QPs are in use", kMaxQps));
  const uint64_t ringCapacity = pow2AtLeast(static_cast<uint64_t>(std::max(caps.recvDepth, 1)));
  const uint64_t ringBytes = ringCapacity * sizeof(uint64_t);
  const uint64_t ringOffset = d->arena.take(ringBytes);
  if (ringOffset == 0) fail("createQp", "the device's shared arena is full (ENOMEM)");
  std::memset(d->base + ringOffset, 0, ringBytes);
  d->nextQpSlot = slot + 1;

  auto* qp = new FakeQp;
  qp->device = d, qp->slot = slot, qp->shared = &d->sharedQps[slot];
  qp->sendCq = as<FakeCq>(sendCq), qp->recvCq = as<FakeCq>(recvCq), qp->caps = caps;
  qp->sq.resize(static_cast<size_t>(caps.sendDepth));
  qp->faults.resize(qp->sq.size());
  qp->inlineBytes.resize(qp->sq.size() * static_cast<size_t>(caps.maxInline));
  qp->recvRing = reinterpret_cast<std::atomic<uint64_t>*>(d->base + ringOffset);
  qp->recvMask = ringCapacity - 1, qp->recvRingOffset = ringOffset, qp->recvRingBytes = ringBytes;
  qp->qpNum = 0x100 + processState().qpNums.fetch_add(1) %
                          (0xffffff - 0x100);  // 24 bits, unique per process
  SharedQp* s = qp->shared;
  s->state.store(static_cast<uint32_t>(QpState::Reset), std::memory_order_relaxed);
  s->broken.store(0, std::memory_order_relaxed);
  s->recvCapacity.store(static_cast<uint32_t>(ringCapacity), std::memory_order_relaxed);
  s->recvRing.store(ringOffset, std::memory_order_relaxed);
  s->recvCq.store(qp->recvCq->offset, std::memory_order_relaxed);
  s->recvPosted.store(0, std::memory_order_relaxed);
  s->recvConsumed.store(0, std::memory_order_relaxed);
  s->qpNum.store(qp->qpNum, std::memory_order_release);
  ++qp->sendCq->users, ++qp->recvCq->users;
  d->qps[slot] = qp;
  *qpNum = qp->qpNum;
  return as<QueuePair>(qp);
}

void FakeFabric::destroyQp(QueuePair* handle) {
  FakeQp* qp = as<FakeQp>(handle);
  FakeDevice* d = qp->device;
  qp->shared->qpNum.store(0, std::memory_order_release);  // peers now see it gone
  qp->shared->state.store(static_cast<uint32_t>(QpState::Error), std::memory_order_release);
  d->waiting.erase(std::remove(d->waiting.begin(), d->waiting.end(), qp), d->waiting.end());
  d->qps[qp->slot] = nullptr;
  --qp->sendCq->users, --qp->recvCq->users;
  d->arena.give(qp->recvRingOffset, qp->recvRingBytes);
  if (qp->peer != nullptr) --qp->peer->users;
  delete qp;
}

void FakeFabric::checkStep(const FakeQp* qp, const char* step, QpState needed) const {
  if (qp->state != needed) {
    fail(step, format("QP %u is in %s, %s needs it in %s (EINVAL)", qp->qpNum, stateName(qp->state),
                      step, stateName(needed)));
  }
}

void FakeFabric::toInit(QueuePair* handle, const PathOptions& path) {
  FakeQp* qp = as<FakeQp>(handle);
  checkStep(qp, "toInit", QpState::Reset);
  if (path.port != 1)
    fail("toInit", format("QP %u: port %d: fake_0 has port 1 only", qp->qpNum, path.port));
  qp->state = QpState::Init;
  qp->shared->state.store(static_cast<uint32_t>(QpState::Init), std::memory_order_release);
}

void FakeFabric::toRtr(QueuePair* handle, const RemoteQp& remote, const PathOptions& path) {
  FakeQp* qp = as<FakeQp>(handle);
  FakeDevice* d = qp->device;
  checkStep(qp, "toRtr", QpState::Init);
  if (path.gidIndex < 0 || path.gidIndex > 1) {
    fail("toRtr", format("QP %u: source GID index %d is not set (fake_0 has GIDs 0 and 1)",
                         qp->qpNum, path.gidIndex));
  }
  if (path.mtu != 256 && path.mtu != 512 && path.mtu != 1024 && path.mtu != 2048 &&
      path.mtu != 4096) {
    fail("toRtr", format("QP %u: MTU %d is not 256..4096 (EINVAL)", qp->qpNum, path.mtu));
  }
  if (!remote.useGid)
    fail("toRtr", format("QP %u: fake_0 is RoCE: the peer needs a GID", qp->qpNum));
  const int pid = pidOfGid(remote.gid);
  if (pid < 0) {
    fail("toRtr", format("QP %u: GID %s names no process of the fake fabric", qp->qpNum,
                         gidText(remote.gid).c_str()));
  }
  SharedQp* r = nullptr;
  PeerNode* peer = findQp(d, pid, remote.qpNum, &r);
  if (peer == nullptr) {
    fail("toRtr", format("QP %u: no QP %u in process %d (GID %s)%s", qp->qpNum, remote.qpNum, pid,
                         gidText(remote.gid).c_str(), processGone(pid) ? ", which is gone" : ""));
  }
  const uint64_t ring = r->recvRing.load(std::memory_order_relaxed);
  const uint64_t capacity = r->recvCapacity.load(std::memory_order_relaxed);
  const uint64_t cq = r->recvCq.load(std::memory_order_relaxed);
  if (ring + capacity * sizeof(uint64_t) > peer->bytes || cq + sizeof(CqShared) > peer->bytes) {
    fail("toRtr",
         format("QP %u: QP %u of process %d has a broken record", qp->qpNum, remote.qpNum, pid));
  }
  qp->peer = peer, ++peer->users;
  qp->remote = r, qp->remoteQpNum = remote.qpNum;
  qp->remoteSlot = static_cast<uint32_t>(r - peer->qps);
  qp->remoteRing = reinterpret_cast<std::atomic<uint64_t>*>(peer->base + ring);
  qp->remoteRingMask = capacity - 1;
  qp->remoteCq = reinterpret_cast<CqShared*>(peer->base + cq);
  qp->remoteSlots = reinterpret_cast<CqSlot*>(qp->remoteCq + 1);
  qp->state = QpState::Rtr;
  qp->shared->state.store(static_cast<uint32_t>(QpState::Rtr), std::memory_order_release);
}

void FakeFabric::toRts(QueuePair* handle, const PathOptions& path) {
  FakeQp* qp = as<FakeQp>(handle);
  checkStep(qp, "toRts", QpState::Rtr);
  // What hardware would retry for: 4.096 us * 2^timeout per try, retryCount
  // retries (timeout 0: forever), capped.
  if (path.timeout > 0 && path.timeout < 32) {
    const double seconds =
        4.096e-6 * double(uint64_t{1} << path.timeout) * (std::max(path.retryCount, 0) + 1);
    qp->retryWait = std::min<Clock::duration>(
        kMaxRetryWait,
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  }
  qp->state = QpState::Rts;
  qp->shared->state.store(static_cast<uint32_t>(QpState::Rts), std::memory_order_release);
}

// Scans `pid`'s nodes of this fabric (those mapped already, then its other
// memfds) for QP `qpNum`. Set-up path: system calls are fine here.
PeerNode* FakeFabric::findQp(FakeDevice* d, int pid, uint32_t qpNum, SharedQp** found) {
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
  d->peers.erase(std::remove_if(d->peers.begin(), d->peers.end(),
                                [](const std::unique_ptr<PeerNode>& p) {
                                  if (p->users > 0 || p->header->magic.load() == kNodeMagic) {
                                    return false;
                                  }
                                  munmap(p->base, p->bytes);
                                  if (p->pidfd >= 0) close(p->pidfd);
                                  return true;
                                }),
                 d->peers.end());
  for (auto& p : d->peers) {
    if (p->pid == pid && lookIn(p.get())) return p.get();
  }
  const std::string dir = format("/proc/%d/fd", pid);
  const std::string want = std::string("/memfd:") + kNodeName + d->fabric + " (deleted)";
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return nullptr;
  PeerNode* result = nullptr;
  while (dirent* entry = readdir(listing)) {
    if (entry->d_name[0] == '.') continue;
    const std::string path = dir + "/" + entry->d_name;
    char link[512];
    const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    if (n <= 0 || want.compare(0, std::string::npos, link, static_cast<size_t>(n)) != 0) continue;
    PeerNode* p = mapNode(d, pid, path);
    if (p != nullptr && lookIn(p)) {
      result = p;
      break;
    }
  }
  closedir(listing);
  return result;
}

PeerNode* FakeFabric::mapNode(FakeDevice* d, int pid, const std::string& path) {
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
              std::strncmp(h->fabric, d->fabric.c_str(), sizeof h->fabric) == 0 &&
              h->qpTable + uint64_t{h->maxQps} * sizeof(SharedQp) <= p->bytes &&
              h->mrTable + uint64_t{h->maxMrs} * sizeof(SharedMr) <= p->bytes;
  for (auto& known : d->peers) fits = fits && known->nodeId != h->nodeId;
  if (!fits) {
    munmap(base, p->bytes);
    return nullptr;
  }
  p->pid = pid, p->self = pid == d->pid, p->nodeId = h->nodeId;
  p->qps = reinterpret_cast<SharedQp*>(p->base + h->qpTable);
  p->mrs = reinterpret_cast<SharedMr*>(p->base + h->mrTable);
  p->maxQps = h->maxQps, p->maxMrs = h->maxMrs;
  if (!p->self) p->pidfd = pidfdOpen(pid);
  d->peers.push_back(std::move(p));
  return d->peers.back().get();
}

// ------------------------------------------------------------ posting

int FakeFabric::postSend(QueuePair* handle, const SendRequest* requests, size_t count) {
  FakeQp* qp = as<FakeQp>(handle);
  if (qp->state != QpState::Rts && qp->state != QpState::Error) return EINVAL;
  for (size_t i = 0; i < count; ++i) {
    const SendRequest& wr = requests[i];
    if (wr.opcode != Opcode::Write && wr.opcode != Opcode::WriteWithImm &&
        wr.opcode != Opcode::Read) {
      return EINVAL;
    }
    if (wr.inlineData && (wr.opcode == Opcode::Read || wr.bytes > uint32_t(qp->caps.maxInline))) {
      return EINVAL;
    }
  }
  if (qp->posted - qp->retired + count > qp->sq.size()) return ENOMEM;
  const size_t inlineBytes = static_cast<size_t>(qp->caps.maxInline);
  for (size_t i = 0; i < count; ++i) {
    const size_t at = qp->posted % qp->sq.size();
    SendRequest& wr = qp->sq[at] = requests[i];
    if (wr.inlineData && wr.bytes > 0) {
      uint8_t* copy = &qp->inlineBytes[at * inlineBytes];
      std::memcpy(copy, wr.local, wr.bytes);
      wr.local = copy;
    }
    qp->faults[at] = kNoFault;
    if (fault_.kind != kNoFault && processState().faultCount.fetch_add(1) + 1 == fault_.at) {
      qp->faults[at] = fault_.kind;
    }
    ++qp->posted;
  }
  advance(qp);
  return 0;
}

int FakeFabric::postRecv(QueuePair* handle, const RecvRequest* requests, size_t count) {
  FakeQp* qp = as<FakeQp>(handle);
  if (qp->state == QpState::Reset) return EINVAL;
  if (qp->recvPosted - qp->recvRetired + count > static_cast<uint64_t>(qp->caps.recvDepth)) {
    return ENOMEM;
  }
  for (size_t i = 0; i < count; ++i) {
    qp->recvRing[(qp->recvPosted + i) & qp->recvMask].store(requests[i].wrId,
                                                            std::memory_order_relaxed);
  }
  qp->recvPosted += count;
  qp->shared->recvPosted.store(qp->recvPosted, std::memory_order_release);
  if (qp->state == QpState::Error) flushReceives(qp);
  return 0;
}

void FakeFabric::advance(FakeQp* qp) {
  while (qp->executed < qp->posted && execute(qp, qp->executed)) ++qp->executed;
  if (qp->executed < qp->posted && !qp->listed) {
    qp->listed = true;
    qp->device->waiting.push_back(qp);
  }
}

void FakeFabric::advanceWaiting(FakeDevice* d) {
  for (size_t i = 0; i < d->waiting.size(); ++i) advance(d->waiting[i]);  // may append
  auto done = [](FakeQp* qp) {
    if (qp->executed < qp->posted) return false;
    qp->listed = false;
    return true;
  };
  d->waiting.erase(std::remove_if(d->waiting.begin(), d->waiting.end(), done), d->waiting.end());
}

void FakeFabric::complete(FakeQp* qp, uint64_t index, WcStatus status) {
  const SendRequest& wr = qp->sq[index % qp->sq.size()];
  const Entry e{wr.wrId, index,     status,   wr.opcode, status == WcStatus::Success ? wr.bytes : 0,
                0,       qp->qpNum, qp->slot, false};
  if (!push(qp->sendCq->shared, qp->sendCq->slots, e, static_cast<uint32_t>(qp->device->pid))) {
    overrun(qp->sendCq);
  }
}

void FakeFabric::enterError(FakeQp* qp) {
  if (qp->state == QpState::Error) return;
  qp->state = QpState::Error, qp->stalled = false;
  qp->shared->state.store(static_cast<uint32_t>(QpState::Error), std::memory_order_release);
  if (!qp->fatalReported) {
    qp->fatalReported = true;
    AsyncEvent event;
    event.kind = AsyncEventKind::QpFatal, event.qpNum = qp->qpNum, event.code = kEventQpFatal;
    qp->device->events.push_back(event);
  }
  flushReceives(qp);
  if (qp->executed < qp->posted && !qp->listed) {  // flushed by the next advance
    qp->listed = true;
    qp->device->waiting.push_back(qp);
  }
}

void FakeFabric::flushReceives(FakeQp* qp) {
  std::atomic<uint64_t>& consumed = qp->shared->recvConsumed;
  uint64_t c = consumed.load(std::memory_order_acquire);
  while (c < qp->recvPosted) {
    const uint64_t wrId = qp->recvRing[c & qp->recvMask].load(std::memory_order_relaxed);
    if (!consumed.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    ++c;
    const Entry e{wrId,     0,   WcStatus::WrFlushErr, Opcode::RecvWithImm, 0, 0, qp->qpNum,
                  qp->slot, true};
    if (!push(qp->recvCq->shared, qp->recvCq->slots, e, static_cast<uint32_t>(qp->device->pid))) {
      overrun(qp->recvCq);
    }
  }
}

// Takes the oldest receive posted on the peer QP.
bool FakeFabric::claimReceive(FakeQp* qp, uint64_t* wrId) {
  std::atomic<uint64_t>& consumed = qp->remote->recvConsumed;
  uint64_t c = consumed.load(std::memory_order_acquire);
  for (;;) {
    if (c >= qp->remote->recvPosted.load(std::memory_order_acquire)) return false;
    const uint64_t id = qp->remoteRing[c & qp->remoteRingMask].load(std::memory_order_relaxed);
    if (consumed.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) {
      *wrId = id;
      return true;
    }
  }
}

// Unmaps the peers' blocks whose memory has gone: target blocks released,
// dma-buf regions deregistered (or on a node no longer mapped).
void FakeFabric::sweepBlocks(FakeDevice* d) {
  auto gone = [d](const RemoteBlock& b) {
    if (b.header != nullptr) return b.header->released.load(std::memory_order_relaxed) != 0;
    for (const auto& p : d->peers) {
      if (p->nodeId == b.nodeId) return p->mrs[b.slot].key.load(std::memory_order_relaxed) != b.key;
    }
    return true;
  };
  for (auto b = d->blocks.begin(); b != d->blocks.end();) {
    if (gone(b->second)) {
      munmap(b->second.mapping, b->second.mapBytes);
      b = d->blocks.erase(b);
    } else {
      ++b;
    }
  }
}

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

// The peer's target block or dma-buf region `m` names, mapped here and
// cached by the block's id, which is new for every dma-buf registration:
// a mapping is never found for another one.
RemoteBlock* FakeFabric::mapBlock(FakeDevice* d, const PeerNode* peer, const MrRecord& m) {
  auto it = d->blocks.find(m.blockId);
  if (it != d->blocks.end()) return &it->second;
  sweepBlocks(d);
  const int file = open(format("/proc/%d/fd/%d", peer->pid, m.blockFd).c_str(), O_RDWR | O_CLOEXEC);
  if (file < 0) return nullptr;
  struct stat st {};
  RemoteBlock block{};
  const bool mapped =
      fstat(file, &st) == 0 && (m.kind == BlockKind::Target ? mapTarget(file, st, m.blockId, &block)
                                                            : mapDmabuf(file, st, peer, m, &block));
  close(file);
  if (!mapped) return nullptr;
  return &d->blocks.emplace(m.blockId, block).first->second;
}

// Where `bytes` at `address` under `rkey` lie in this process; false for a
// remote access error. Hot path: no allocation once the block is mapped.
bool FakeFabric::resolveRemote(FakeQp* qp, uint32_t rkey, uint64_t address, uint32_t bytes,
                               int access, uint8_t** out) {
  const PeerNode* peer = qp->peer;
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
  RemoteBlock* block = mapBlock(qp->device, peer, m);
  if (block == nullptr ||
      (block->header != nullptr && block->header->released.load(std::memory_order_relaxed) != 0) ||
      !within(address, bytes, m.blockAddress, block->bytes)) {
    return false;
  }
  *out = block->data + (address - m.blockAddress);
  return true;
}

// Executes WR `index`, or leaves it (false) while the peer QP is not yet in
// RTR. Hot path: no allocation; a clock read, and one system call a
// millisecond per peer to see that its process lives.
bool FakeFabric::execute(FakeQp* qp, uint64_t index) {
  const SendRequest& wr = qp->sq[index % qp->sq.size()];
  const uint8_t fault = qp->faults[index % qp->sq.size()];
  auto failWith = [&](WcStatus status) {
    complete(qp, index, status);
    enterError(qp);
    return true;
  };
  if (qp->state == QpState::Error) {
    complete(qp, index, WcStatus::WrFlushErr);
    return true;
  }
  if (fault == kFaultRetry) return failWith(WcStatus::RetryExcErr);
  if (fault == kFaultFlush) return failWith(WcStatus::WrFlushErr);
  const bool read = wr.opcode == Opcode::Read;
  if (wr.bytes > 0 && !wr.inlineData) {
    const uint32_t slot = wr.lkey >> 8;
    const SharedMr* m = slot < kMaxMrs ? &qp->device->sharedMrs[slot] : nullptr;
    if (wr.lkey == 0 || m == nullptr || m->key.load(std::memory_order_relaxed) != wr.lkey ||
        (read && (m->access.load(std::memory_order_relaxed) & kLocalWrite) == 0) ||
        !within(reinterpret_cast<uintptr_t>(wr.local), wr.bytes,
                m->address.load(std::memory_order_relaxed),
                m->length.load(std::memory_order_relaxed))) {
      return failWith(WcStatus::LocProtErr);
    }
  }
  PeerNode* peer = qp->peer;
  if (!peer->self) {
    const Clock::time_point now = Clock::now();
    if (now >= peer->nextCheck && !peer->gone) {
      peer->nextCheck = now + kLivenessInterval;
      peer->gone = processGone(peer->pid, peer->pidfd);
    }
    if (peer->gone) return failWith(WcStatus::RetryExcErr);
  }
  SharedQp* remote = qp->remote;
  const auto remoteState = static_cast<QpState>(remote->state.load(std::memory_order_acquire));
  if (remote->qpNum.load(std::memory_order_acquire) != qp->remoteQpNum ||
      remoteState == QpState::Error || remote->broken.load(std::memory_order_acquire) != 0) {
    return failWith(WcStatus::RetryExcErr);  // hardware: no answer, retries run out
  }
  if (remoteState < QpState::Rtr) {
    const Clock::time_point now = Clock::now();
    if (!qp->stalled) {
      qp->stalled = true, qp->stalledSince = now;
      return false;
    }
    return now - qp->stalledSince < qp->retryWait ? false : failWith(WcStatus::RetryExcErr);
  }
  qp->stalled = false;
  uint8_t* there = nullptr;
  const uint32_t rkey = fault == kFaultRkey ? wr.rkey | kCorruptKeyBit : wr.rkey;
  if ((wr.bytes > 0 || fault == kFaultRkey) &&  // zero bytes: the rkey is not checked
      !resolveRemote(qp, rkey, wr.remoteAddr, wr.bytes, read ? kRemoteRead : kRemoteWrite,
                     &there)) {
    return failWith(WcStatus::RemAccessErr);
  }
  uint64_t recvWrId = 0;
  if (wr.opcode == Opcode::WriteWithImm && !claimReceive(qp, &recvWrId)) {
    return failWith(WcStatus::RnrRetryExcErr);
  }
  if (wr.bytes > 0) {
    if (read) {
      std::memcpy(wr.local, there, wr.bytes);
    } else {
      std::memcpy(there, wr.local, wr.bytes);
    }
  }
  if (wr.opcode == Opcode::WriteWithImm) {
    const Entry e{recvWrId, 0,      WcStatus::Success, Opcode::RecvWithImm,
                  wr.bytes, wr.imm, qp->remoteQpNum,   qp->remoteSlot,
                  true};
    if (!push(qp->remoteCq, qp->remoteSlots, e, static_cast<uint32_t>(qp->device->pid))) {
      remote->broken.store(1, std::memory_order_release);  // its owner sees the overrun
    }
  }
  if (wr.signaled) complete(qp, index, WcStatus::Success);
  return true;
}

}  // namespace

std::unique_ptr<VerbsBackend> makeFakeFabric(const FakeOptions& options) {
  if (options.fabric.size() > kMaxFabricName) {
    throw Error(ErrorCode::InvalidArgument,
                format("fake fabric name of %zu characters: at most %zu", options.fabric.size(),
                       kMaxFabricName));
  }
  Fault fault = parseFault(options.fault);
  processState();  // registers the fork handler before anything is counted
  return std::make_unique<FakeFabric>(options.fabric, fault);
}

}  // namespace braid::transport::ibverbs
