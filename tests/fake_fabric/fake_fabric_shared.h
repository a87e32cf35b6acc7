// The fake fabric's shared memory (fake_fabric.h; fake_fabric.cc is the
// VerbsBackend over it). Internal to the fake: nothing outside its files
// includes this.
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
// Here: that layout, the CQ ring's two ends, the GIDs that name a
// process, and PeerMap, through which a device reaches its peers' nodes
// and memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs::fake_fabric {

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the fake fabric shares atomics between processes");

constexpr uint64_t kNodeMagic = 0x65646f4e6b614642ull;
constexpr uint64_t kBlockMagic = 0x6b636f6c426b6142ull;
constexpr uint32_t kLayoutVersion = 2;
constexpr uint32_t kMaxQps = 1024;
constexpr uint32_t kMaxMrs = 1u << 16;  // keys are slot << 8 | generation
constexpr size_t kMaxFabricName = 200;
constexpr char kNodeName[] = "braid-fabric:";  // a node's memfd: this and the fabric's name
constexpr char kBlockName[] = "braid-fabric-target";

// ------------------------------------------------------------ layout

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

// A region's SharedMr as a reader found it under its key, or as its
// owner publishes it.
struct MrRecord {
  uint32_t slot = 0, key = 0, access = 0;
  BlockKind kind = BlockKind::None;
  int blockFd = -1;
  uint64_t address = 0, length = 0, blockId = 0, blockAddress = 0, fileOffset = 0, inode = 0;
};

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
inline uint64_t slotWord(uint64_t ticket, uint32_t pid, uint64_t state) {
  return (ticket & kTicketMask) << 24 | (uint64_t{pid} & 0x3fffff) << 2 | state;
}
inline uint64_t ticketOf(uint64_t word) { return word >> 24; }
inline uint32_t pidOf(uint64_t word) { return static_cast<uint32_t>(word >> 2) & 0x3fffff; }
inline uint64_t stateOf(uint64_t word) { return word & 3; }

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

// A completion on its way into a CqSlot.
struct Entry {
  uint64_t wrId, sqIndex;
  WcStatus status;
  Opcode opcode;
  uint32_t bytes, imm, qpNum, qpSlot;
  bool recv;
};

// ------------------------------------------------------------ system bits

inline uint64_t roundUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }
inline uint64_t pow2AtLeast(uint64_t value) {
  uint64_t p = 1;
  while (p < value) p <<= 1;
  return p;
}
// Whether [at, at + bytes) lies in [begin, begin + length), overflow aside.
inline bool within(uint64_t at, uint64_t bytes, uint64_t begin, uint64_t length) {
  return at >= begin && at - begin <= length && bytes <= length - (at - begin);
}

void futexWake(std::atomic<uint32_t>* word);
void futexWait(std::atomic<uint32_t>* word, uint32_t value, Clock::duration timeout);

int pidfdOpen(int pid);  // -1 with errno where the kernel has none
// Whether process `pid` has exited, zombie or reaped (`pidfd` may be -1).
bool processGone(int pid, int pidfd);
bool processGone(int pid);

// Unique among all processes and nodes for as long as pids are: the pid
// and a count of this process's ids.
uint64_t newId();

// ------------------------------------------------------------ GIDs

// Index 0: fe80::0000:00ff:fe<pid>, the EUI-64 of MAC 02:00:00:<pid>;
// index 1: ::ffff:10.<pid>; others are zero. Pids are below 2^22, so 24
// bits hold them.
Gid makeGid(int index, int pid);
// The pid a GID of makeGid() names, or -1.
int pidOfGid(const Gid& gid);
std::string gidText(const Gid& gid);

// ------------------------------------------------------------ CQ rings

// Claims the next slot of the ring (wherever this process maps it), fills
// and publishes it, and wakes a waiting consumer. False when the ring is
// full: then it is marked overrun and the completion is lost.
bool push(CqShared* cq, CqSlot* slots, const Entry& e, uint32_t pid);

// The consumer's end of a CQ ring: its owner's alone.
class CqRing {
 public:
  // The bytes a ring of `capacity` slots (a power of two) takes.
  static uint64_t bytesFor(uint64_t capacity) {
    return sizeof(CqShared) + capacity * sizeof(CqSlot);
  }
  // Sets up an empty ring of `capacity` slots in the bytesFor() bytes at
  // `at`, which nobody else sees yet.
  CqRing(uint8_t* at, uint64_t capacity);

  // The oldest published completion, or nullptr. A slot claimed for 10 ms
  // by a producer that has died since is freed and stepped over, or the
  // ring would never deliver another (`self`: this process, which is not
  // dead). Hot path: no allocation, no system call unless a slot stalls.
  const CqSlot* front(int self);
  // Frees the slot front() gave for its next round.
  void pop();
  // Whether a producer has claimed or published the slot at the head.
  bool headTaken() const;

  CqShared* shared() const { return shared_; }
  CqSlot* slots() const { return slots_; }

 private:
  bool skipDeadProducer(uint64_t word, int self);

  CqShared* shared_;
  CqSlot* slots_;
  uint64_t capacity_, mask_;
  uint64_t head_ = 0;
  uint64_t stalledTicket_ = ~uint64_t{0};
  Clock::time_point stalledSince_{};
};

// ------------------------------------------------------------ peers

// Another process's node (or this process's, for a QP connected within
// it), mapped here.
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
  Clock::time_point nextCheck{};  // the backend's liveness check
  int users = 0;                  // QPs connected to it
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

// The peers' nodes, target blocks and dma-buf regions one device has
// mapped; it unmaps them all when it goes. A node stays mapped while a QP
// uses it (PeerNode::users), a block until its memory is released or
// deregistered.
class PeerMap {
 public:
  PeerMap(std::string fabric, int pid);
  ~PeerMap();
  PeerMap(const PeerMap&) = delete;
  PeerMap& operator=(const PeerMap&) = delete;

  // The node of process `pid` in this fabric that holds QP `qpNum`, its
  // record in `*found`: those mapped already first, then the process's
  // other memfds. nullptr: none. Set-up path: system calls are fine here.
  PeerNode* findQp(int pid, uint32_t qpNum, SharedQp** found);
  // Where `bytes` at `address` under `rkey` of `peer` lie in this process;
  // false for a remote access error: a key unknown or deregistered, a
  // range outside its region, `access` (Access bits) not granted, memory
  // in neither a target block nor a dma-buf region. Hot path: no
  // allocation and no system call once the block is mapped.
  bool resolve(const PeerNode* peer, uint32_t rkey, uint64_t address, uint32_t bytes, int access,
               uint8_t** out);

 private:
  PeerNode* mapNode(int pid, const std::string& path);
  RemoteBlock* mapBlock(const PeerNode* peer, const MrRecord& m);
  void sweepBlocks();

  const std::string fabric_;
  const int pid_;
  std::vector<std::unique_ptr<PeerNode>> peers_;
  std::unordered_map<uint64_t, RemoteBlock> blocks_;  // by block id
};

}  // namespace braid::transport::ibverbs::fake_fabric
