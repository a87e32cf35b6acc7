// VerbsBackend: the seam between the ibverbs transport's protocol engine
// and the RDMA device. Everything the engine does to a device goes through
// these operations, on braid's own plain structs, so the same engine runs
// over libibverbs (verbs_real.h) and over the fake fabric the tests use
// (tests/fake_fabric/fake_fabric.h: memory regions in shared memory,
// completions pushed into the peer's queue). Both are loaded at run time:
// libbraid links neither, and loads the fake's library only when
// BRAID_IB_FAKE names a fabric (fake_fabric_loader.h), so a change to
// VerbsBackend changes that library's interface too (kFakeFabricInterface).
// The seam sits above verbs.h, not in front of the library: ibv_post_send
// and ibv_poll_cq are inline functions there, so a backend is a whole
// implementation of the operations, not a table of library symbols.
//
// Handles are pointers to types each backend defines for itself. A handle
// is used by one thread at a time (the engine's executor), except that
// the fake fabric's peers write into each other's shared memory.
//
// Errors: operations that set something up throw Error(SystemError) naming
// the operation and the device's reason; postSend/postRecv return 0 or an
// errno-style code, as ibv_post_send does, because the engine turns that
// into a failure of the connection rather than of the communicator.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid::transport::ibverbs {

using Clock = std::chrono::steady_clock;

// Opaque handles, each defined by the backend that made it.
struct Device;
struct ProtectionDomain;
struct CompletionQueue;
struct QueuePair;
struct MemoryRegion;

struct Gid {
  std::array<uint8_t, 16> raw{};
  bool operator==(const Gid& other) const { return raw == other.raw; }
};

enum class LinkLayer : uint8_t { InfiniBand = 1, Ethernet = 2 };
enum class PortState : uint8_t { Down = 1, Init = 2, Armed = 3, Active = 4, Other = 5 };

struct DeviceInfo {
  std::string name;  // e.g. "mlx5_0"
  int ports = 0;     // numbered 1..ports
  int maxQpWr = 0;   // deepest send or receive queue
  int maxCqe = 0;    // deepest completion queue
  uint64_t maxMrSize = 0;
};

struct PortInfo {
  PortState state = PortState::Down;
  LinkLayer linkLayer = LinkLayer::InfiniBand;
  uint16_t lid = 0;
  int activeMtu = 0;  // bytes: 256, 512, 1024, 2048 or 4096
  int gidTableLength = 0;
};

// Access rights of a memory region (the IBV_ACCESS_* bits they stand for).
enum Access : int {
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
};

struct Keys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// Work completion status, numbered as ibv_wc_status is.
enum class WcStatus : int {
  Success = 0,
  LocLenErr = 1,
  LocQpOpErr = 2,
  LocEecOpErr = 3,
  LocProtErr = 4,
  WrFlushErr = 5,
  MwBindErr = 6,
  BadRespErr = 7,
  LocAccessErr = 8,
  RemInvReqErr = 9,
  RemAccessErr = 10,
  RemOpErr = 11,
  RetryExcErr = 12,
  RnrRetryExcErr = 13,
  LocRddViolErr = 14,
  RemInvRdReqErr = 15,
  RemAbortErr = 16,
  InvEecnErr = 17,
  InvEecStateErr = 18,
  FatalErr = 19,
  RespTimeoutErr = 20,
  GeneralErr = 21,
};
// "IBV_WC_RETRY_EXC_ERR" and so on; "IBV_WC_<n>" for numbers it does not know.
const char* wcStatusName(WcStatus status);
// What usually causes it, for the error message ("" where nothing useful
// can be said): retry exceeded means the peers cannot reach each other,
// often a wrong GID index; a remote access error means a bad rkey or a
// write outside the peer's region.
const char* wcStatusHint(WcStatus status);

enum class Opcode : uint8_t {
  Write = 0,         // RDMA WRITE
  WriteWithImm = 1,  // RDMA WRITE, then a completion with `imm` at the peer
  Read = 2,          // RDMA READ
  RecvWithImm = 3,   // a completion only: a posted receive took an immediate
};

struct Completion {
  uint64_t wrId = 0;
  WcStatus status = WcStatus::Success;
  Opcode opcode = Opcode::Write;
  uint32_t bytes = 0;  // RecvWithImm: the bytes the peer wrote
  uint32_t imm = 0;    // RecvWithImm: the immediate, in host order
  uint32_t qpNum = 0;  // the local QP it belongs to
  uint32_t vendorError = 0;
};

// One work request, with at most one scatter/gather element.
struct SendRequest {
  uint64_t wrId = 0;
  Opcode opcode = Opcode::Write;  // Write, WriteWithImm or Read
  bool signaled = false;          // a completion is made (else only on error)
  bool inlineData = false;        // the bytes are copied at post time (small writes)
  void* local = nullptr;          // Write: the source; Read: the destination
  uint32_t lkey = 0;
  uint32_t bytes = 0;  // may be 0
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;  // WriteWithImm, in host order
};

// A receive for an immediate: no buffer (RDMA WRITE places the data).
struct RecvRequest {
  uint64_t wrId = 0;
};

struct QpCaps {
  int sendDepth = 0;  // outstanding send WRs
  int recvDepth = 0;  // outstanding receive WRs
  int maxInline = 0;  // bytes a WR may carry inline
};

// What RTR needs to know of the peer's QP and the path to it.
struct RemoteQp {
  uint32_t qpNum = 0;
  uint32_t psn = 0;  // the peer's initial send packet sequence number
  uint16_t lid = 0;  // InfiniBand: the peer port's LID
  Gid gid;           // Ethernet (RoCE), or InfiniBand across subnets
  bool useGid = false;
};

struct PathOptions {
  int port = 1;
  int gidIndex = 0;    // the local GID used as source (useGid)
  int mtu = 1024;      // bytes, the smaller of both ends
  uint32_t psn = 0;    // this QP's initial send PSN (RTS)
  int timeout = 20;    // local ACK timeout, 4.096 us * 2^timeout (BRAID_IB_TIMEOUT)
  int retryCount = 7;  // BRAID_IB_RETRY_CNT
  int rnrRetry = 7;    // 7: retry forever
  int serviceLevel = 0;
  int trafficClass = 0;
};

enum class AsyncEventKind : uint8_t {
  QpFatal,        // a QP went to the error state
  QpAccessError,  // a QP saw an access violation
  CqError,
  PortActive,
  PortError,  // a port went down
  DeviceFatal,
  Other,
};
struct AsyncEvent {
  AsyncEventKind kind = AsyncEventKind::Other;
  uint32_t qpNum = 0;  // QP events
  int port = 0;        // port events
  int code = 0;        // the ibv_event_type
};

class VerbsBackend {
 public:
  virtual ~VerbsBackend() = default;
  // "libibverbs", "fake fabric '<name>'": for log and error lines.
  virtual std::string describe() const = 0;

  // The devices there are, by name (empty: none).
  virtual std::vector<std::string> deviceNames() = 0;
  virtual Device* openDevice(const std::string& name, DeviceInfo* info) = 0;
  virtual void closeDevice(Device* device) = 0;
  virtual PortInfo queryPort(Device* device, int port) = 0;
  virtual Gid queryGid(Device* device, int port, int index) = 0;

  virtual ProtectionDomain* allocPd(Device* device) = 0;
  virtual void deallocPd(ProtectionDomain* pd) = 0;

  // Host memory the peers' RDMA operations may target (page-aligned,
  // zeroed): the fake fabric must place it in memory its peers can map.
  virtual void* allocateTarget(size_t bytes) = 0;
  virtual void releaseTarget(void* memory, size_t bytes) = 0;
  // Registers [address, address + bytes) with `access` (Access bits).
  // Memory a peer reads or writes must come from allocateTarget().
  virtual MemoryRegion* registerMemory(ProtectionDomain* pd, void* address, size_t bytes,
                                       int access, Keys* keys) = 0;
  // Registers `bytes` of the dma-buf `fd` at `offset`, seen at `address`
  // (ibv_reg_dmabuf_mr). Returns nullptr where the device or the library
  // cannot (the caller stages through host memory then).
  virtual MemoryRegion* registerDmabuf(ProtectionDomain* pd, int fd, uint64_t offset, size_t bytes,
                                       uint64_t address, int access, Keys* keys) = 0;
  // Registers host memory another allocator made, a MAP_SHARED mapping of
  // the file `fd` at `offset` (the device seam's page-locked memory, which
  // is a memfd): libibverbs registers it by address, as registerMemory()
  // does; the fake fabric maps the file into its peers, as it does a
  // dma-buf, since it reaches no memory it cannot map there.
  virtual MemoryRegion* registerMappedFile(ProtectionDomain* pd, void* address, size_t bytes,
                                           int fd, uint64_t offset, int access, Keys* keys) {
    (void)fd, (void)offset;
    return registerMemory(pd, address, bytes, access, keys);
  }
  virtual void deregister(MemoryRegion* region) = 0;

  virtual CompletionQueue* createCq(Device* device, int depth) = 0;
  virtual void destroyCq(CompletionQueue* cq) = 0;
  // Takes up to `max` completions, oldest first; returns how many.
  virtual int pollCq(CompletionQueue* cq, Completion* out, int max) = 0;
  // Blocks until the queue may hold a completion, or `until`. Spurious
  // returns are allowed; a completion that arrived before the call is not
  // slept through.
  virtual void waitCq(CompletionQueue* cq, Clock::time_point until) = 0;

  // A reliable-connected QP in state RESET; `*qpNum` its number.
  virtual QueuePair* createQp(ProtectionDomain* pd, CompletionQueue* sendCq,
                              CompletionQueue* recvCq, const QpCaps& caps, uint32_t* qpNum) = 0;
  virtual void destroyQp(QueuePair* qp) = 0;
  // RESET -> INIT (remote read and write allowed) -> RTR (connected to
  // `remote`) -> RTS. Throws naming the step.
  virtual void toInit(QueuePair* qp, const PathOptions& path) = 0;
  virtual void toRtr(QueuePair* qp, const RemoteQp& remote, const PathOptions& path) = 0;
  virtual void toRts(QueuePair* qp, const PathOptions& path) = 0;

  virtual int postSend(QueuePair* qp, const SendRequest* requests, size_t count) = 0;
  virtual int postRecv(QueuePair* qp, const RecvRequest* requests, size_t count) = 0;

  // The next asynchronous event of `device`, without blocking; false when
  // there is none.
  virtual bool nextAsyncEvent(Device* device, AsyncEvent* event) = 0;
};

}  // namespace braid::transport::ibverbs
