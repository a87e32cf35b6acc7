// The fake fabric (fake_fabric.h): the VerbsBackend over the shared
// memory of fake_fabric_shared.h.
//
// The handle types of verbs_backend.h are never defined here (another
// backend may define them in the same binary): the fake's own types are
// reinterpret_cast to and from them.
#include "tests/fake_fabric/fake_fabric.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/errors.h"
#include "tests/fake_fabric/fake_fabric_shared.h"

namespace braid::transport::ibverbs {
namespace fake_fabric {
namespace {

constexpr uint64_t kArenaBytes = uint64_t{256} << 20;  // sparse: only what is used is touched
constexpr int kMaxQpWr = 16384;
constexpr int kMaxCqe = 65536;
constexpr int kMaxInline = 256;
constexpr int kGidTableLength = 4;
constexpr uint32_t kCorruptKeyBit = 0x80000000u;  // never set in a key handed out
constexpr auto kLivenessInterval = std::chrono::milliseconds(1);
constexpr auto kMaxRetryWait = std::chrono::seconds(10);
constexpr auto kWaitingPoll = std::chrono::milliseconds(1);
constexpr int kEventCqErr = 0;  // ibv_event_type numbers
constexpr int kEventQpFatal = 1;

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
  explicit FakeDevice(const std::string& fabric) : pid(getpid()), peers(fabric, pid) {}

  int pid;
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
  PeerMap peers;
  std::vector<FakeQp*> waiting;  // QPs with WRs not yet executed
};

struct FakeCq {
  FakeDevice* device;
  uint64_t offset, arenaBytes;  // in the node's arena
  CqRing ring;
  int users = 0;
  bool overrunHandled = false;
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

bool mayHold(const FakeCq* cq) {
  return cq->ring.headTaken() ||
         (!cq->overrunHandled && cq->ring.shared()->overrun.load(std::memory_order_acquire) != 0);
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
  // Host memory the fake did not allocate is reached as a dma-buf is:
  // through its file.
  MemoryRegion* registerMappedFile(ProtectionDomain* pd, void* address, size_t bytes, int fd,
                                   uint64_t offset, int access, Keys* keys) override {
    return registerDmabuf(pd, fd, offset, bytes, reinterpret_cast<uint64_t>(address), access, keys);
  }
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
  FakeMr* publishMr(FakeDevice* d, const MrRecord& record, Keys* keys);
  void retire(FakeDevice* d, const CqSlot& slot);

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
  auto* d = new FakeDevice(fabric_);
  d->memfd = fd, d->bytes = bytes;
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
  const uint64_t bytes = CqRing::bytesFor(capacity);
  const uint64_t offset = d->arena.take(bytes);
  if (offset == 0) fail("createCq", "the device's shared arena is full (ENOMEM)");
  // Nobody else sees the ring before a QP names it.
  auto* cq = new FakeCq{d, offset, bytes, CqRing(d->base + offset, capacity)};
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

// Hot path: no allocation, no system call.
int FakeFabric::pollCq(CompletionQueue* handle, Completion* out, int max) {
  FakeCq* cq = as<FakeCq>(handle);
  FakeDevice* d = cq->device;
  if (!d->waiting.empty()) advanceWaiting(d);
  int n = 0;
  while (n < max) {
    const CqSlot* s = cq->ring.front(d->pid);
    if (s == nullptr) break;
    Completion& c = out[n++];
    c.wrId = s->wrId, c.status = static_cast<WcStatus>(s->status);
    c.opcode = static_cast<Opcode>(s->opcode), c.bytes = s->bytes, c.imm = s->imm;
    c.qpNum = s->qpNum, c.vendorError = 0;
    retire(d, *s);
    cq->ring.pop();
  }
  if (!cq->overrunHandled && cq->ring.shared()->overrun.load(std::memory_order_acquire) != 0) {
    overrun(cq);
  }
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
  CqShared* s = cq->ring.shared();
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
  cq->ring.shared()->overrun.store(1, std::memory_order_release);
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
  PeerNode* peer = d->peers.findQp(pid, remote.qpNum, &r);
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
  const CqRing& ring = qp->sendCq->ring;
  if (!push(ring.shared(), ring.slots(), e, static_cast<uint32_t>(qp->device->pid))) {
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
    const CqRing& ring = qp->recvCq->ring;
    if (!push(ring.shared(), ring.slots(), e, static_cast<uint32_t>(qp->device->pid))) {
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
      !qp->device->peers.resolve(qp->peer, rkey, wr.remoteAddr, wr.bytes,
                                 read ? kRemoteRead : kRemoteWrite, &there)) {
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
}  // namespace fake_fabric

std::unique_ptr<VerbsBackend> makeFakeFabric(const FakeOptions& options) {
  using fake_fabric::kMaxFabricName;
  if (options.fabric.size() > kMaxFabricName) {
    throw Error(ErrorCode::InvalidArgument,
                format("fake fabric name of %zu characters: at most %zu", options.fabric.size(),
                       kMaxFabricName));
  }
  const fake_fabric::Fault fault = fake_fabric::parseFault(options.fault);
  fake_fabric::processState();  // registers the fork handler before anything is counted
  return std::make_unique<fake_fabric::FakeFabric>(options.fabric, fault);
}

}  // namespace braid::transport::ibverbs
