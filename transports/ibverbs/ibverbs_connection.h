// One peer of the ibverbs transport: the FIFOs of transport.h over RC QPs.
// Internal to transports/ibverbs.
//
// The receiver's slots are memory the peer writes into:
// - Message n goes into the peer's slot n % slots as one or more RDMA
//   WRITE_WITH_IMM parts, on QPs (n + j) % qps, each part's immediate
//   carrying n (mod 2^27) and the number of parts; the message's last 8
//   bytes are a trailer with its length and tag. The receiver has it once
//   every part's receive completion is in: all its bytes are then placed
//   (an RC QP places a write before the completion of its immediate).
// - Credit: message n goes out only once the peer has released message
//   n - slots, so its slot is free and a receive is posted for every
//   immediate. The receiver returns credit every slots/2 releases, and
//   whenever it is about to idle with releases it has not told, in a
//   zero-byte RDMA WRITE_WITH_IMM whose immediate carries its release
//   count (mod 2^31): the immediate wakes a sender asleep on its
//   completion queue. A sender's credit moves only with completions it
//   polled, and each credit carries a release the sender has not seen, so
//   at most `slots` credit immediates are outstanding.
// - Receives: every QP keeps `slots` receives posted for data parts, and
//   QP 0 `slots` + kCreditSpare more for credit; each completion's receive
//   is posted again in the same turn. A receive's wr_id says it is one
//   (kRecvWr), because a failed completion carries no opcode.
// - Signaling: only every k-th send WR of a QP asks for a completion
//   (k = slots / (2 qps), at least 1). An unsignaled WR is known done when
//   a later signaled one on its QP completes; a send slot is free once
//   every part of its message is done. Within any `slots` messages each QP
//   carries at least k WRs, so a full ring always holds a signaled one and
//   a sender waiting for a slot never waits forever. Send queues are sized
//   for that and never overrun; credit leaves one entry for data.
// - Flushed: every WR completed, since a QP torn down drops what its
//   device has not yet sent. Where unsignaled WRs trail the last signaled
//   one, a signaled zero-byte RDMA WRITE (no immediate, so nothing at the
//   peer) is posted behind them once the executor asks.
// - Liveness and side-channel words (whom a rank waits for, that it gave
//   up, bye) travel on a tcp connection per peer (`control`), which also
//   carried the set-up exchange: an RC QP sees a dead peer only when a
//   send exhausts its retries, many seconds later, while a socket sees it
//   at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/ibverbs/ib_wire.h"
#include "transports/ibverbs/verbs_backend.h"
#include "transports/transport.h"

namespace braid::transport::ibverbs {

// What the connections of one transport share.
struct Shared {
  uint64_t activity = 0;  // bumped by every completion and change of state
  bool anyFailure = false;
};

// A message's trailer, after its payload.
struct Trailer {
  uint32_t bytes;
  uint32_t tag;
};

// Immediates: data parts carry [31] 0, [30:4] message number, [3:0] parts
// - 1; credit carries [31] 1, [30:0] the release count.
constexpr uint32_t kCreditFlag = 0x80000000u;
constexpr uint64_t kImmSeqMask = (uint64_t{1} << 27) - 1;
constexpr uint64_t kImmCreditMask = (uint64_t{1} << 31) - 1;
constexpr int kMaxQps = 16;
// Receives QP 0 keeps posted for credit immediates beyond the `slots` that
// can be outstanding (see above).
constexpr int kCreditSpare = 2;
// Receive wr_ids carry this bit; send wr_ids are the QP's WR numbers.
constexpr uint64_t kRecvWr = uint64_t{1} << 63;
// The smallest part a message is split into across QPs.
constexpr size_t kMinPartBytes = 64 * 1024;

class IbConnection final : public Connection {
 public:
  struct Qp {
    QueuePair* handle = nullptr;
    uint32_t num = 0;
    uint32_t psn = 0;
    uint64_t posted = 0;        // send WRs posted
    uint64_t retired = 0;       // send WRs known done (a signaled one at or after them completed)
    uint64_t lastSignaled = 0;  // posted count at the last signaled WR
    uint64_t dataParts = 0;     // message parts posted (stripePosts())
    int sendDepth = 0;
    int receives = 0;     // receives to keep posted
    int reposts = 0;      // receives taken since they were last posted again
    bool broken = false;  // a WR failed: nothing more is posted on it
  };

  // A QP's send queue and receives (index `qp` of `qps`), for sizing the
  // completion queue they share.
  static int sendDepthFor(size_t slots, int qps);
  static int receivesFor(size_t slots, int qp);

  // Sets up this end: `qps` QPs in INIT on `port`, the receive slots (in
  // memory the peer may write), the send slots. Throws Error(SystemError).
  IbConnection(Shared& shared, VerbsBackend& backend, ProtectionDomain* pd, CompletionQueue* cq,
               Connection& control, int rank, int peer, size_t slotBytes, size_t slots, int qps,
               const PathOptions& path);
  ~IbConnection() override;
  IbConnection(const IbConnection&) = delete;
  IbConnection& operator=(const IbConnection&) = delete;

  // This end, for the peer.
  EndpointInfo local(uint16_t lid, const Gid& gid, bool useGid, int mtu) const;
  // Connects to the peer's end: RTR, RTS, every receive posted. Throws
  // Error(RemoteError) for an end that does not fit this one.
  void connect(const EndpointInfo& remote, const PathOptions& path);

  size_t slotBytes() const override { return slotBytes_; }
  std::byte* sendSlot(size_t bytes) override;
  void postSend(uint32_t bytes, uint32_t tag) override;
  const Message* peekRecv() override {
    return recvRead_ == recvFilled_ ? nullptr : &recvSlots_[recvRead_ % slots_].message;
  }
  void releaseRecv() override;
  // Every WR completed and no credit owed (see above); asking posts the
  // signaled write that closes an unsignaled tail, at the next repost().
  bool flushed() const override;
  bool peerClosed() const override { return control_.peerClosed(); }
  int failedRank() const override { return control_.failedRank(); }
  GiveUpReason peerReason() const override { return control_.peerReason(); }
  int peerWaitsFor() const override { return control_.peerWaitsFor(); }
  std::vector<uint64_t> stripePosts() const override;

  int peer() const { return peer_; }
  const std::vector<Qp>& qps() const { return qps_; }
  const std::string& failure() const { return failure_; }

  // A completion of one of this connection's QPs (index `qp`).
  void complete(int qp, const Completion& completion);
  // A QP of this connection went to the error state (an async event).
  void qpFailed(int qp, const char* what);
  // Posts the receives taken, the credit owed and the writes flushed()
  // asked for. Returns true if any.
  bool repost();
  // The executor is about to idle: credit for every release not yet told,
  // so a sender never waits on releases this rank made.
  void creditAll();
  // Destroys the QPs (their WRs are flushed) before the memory they use
  // is released: the transport calls it for every connection first.
  void destroyQps();

 private:
  // A receive slot: how many of its message's parts arrived.
  struct RecvSlot {
    int partsExpected = 0;
    int partsArrived = 0;
    uint32_t bytes = 0;
    Message message;
  };
  // A send slot: its message's parts, as (QP, the WR's number there).
  struct SentPart {
    uint16_t qp;
    uint64_t wr;
  };

  bool hasRoom(const Qp& qp, int entries = 1) const {
    return !qp.broken && qp.posted - qp.retired + static_cast<uint64_t>(entries) <=
                             static_cast<uint64_t>(qp.sendDepth);
  }
  // Posts one send WR on `qp` (signaled every k-th, or when asked);
  // returns false when the device refused it (a failure is recorded).
  bool post(Qp& qp, SendRequest request, bool signal);
  void postCredit();
  void received(int qp, const Completion& completion);
  void fail(const std::string& why);
  void retireSends();
  // Destroys the QPs, then deregisters and frees the slots.
  void release();

  Shared& shared_;
  VerbsBackend& backend_;
  ProtectionDomain* pd_;
  Connection& control_;
  int rank_;
  int peer_;
  size_t slotBytes_;
  size_t slots_;
  size_t stride_;  // a slot with its trailer, rounded up to 64 bytes
  uint64_t signalEvery_;
  uint64_t creditEvery_;

  // Receive slots (the peer writes them) and send slots (the device reads
  // them), both registered.
  std::byte* recvMemory_ = nullptr;
  std::byte* sendMemory_ = nullptr;
  MemoryRegion* recvRegion_ = nullptr;
  MemoryRegion* sendRegion_ = nullptr;
  Keys recvKeys_, sendKeys_;
  std::vector<Qp> qps_;

  // The peer's receive slots.
  uint64_t remoteFifo_ = 0;
  uint32_t remoteRkey_ = 0;

  // Send FIFO: messages [sendDone_, sendPosted_) are in flight; the peer
  // released peerReleased_ of them (its credit).
  uint64_t sendPosted_ = 0;
  uint64_t sendDone_ = 0;
  uint64_t peerReleased_ = 0;
  std::vector<SentPart> sentParts_;  // slots x kMaxQps
  std::vector<uint8_t> partCount_;   // per send slot

  // Receive FIFO: [recvRead_, recvFilled_) hold unread messages; this rank
  // last told the peer of advertised_ releases, and owes it credit
  // (creditPending_) that found QP 0's send queue full.
  std::vector<RecvSlot> recvSlots_;
  uint64_t recvFilled_ = 0;
  uint64_t recvRead_ = 0;
  uint64_t advertised_ = 0;
  bool creditPending_ = false;
  mutable bool flushWanted_ = false;  // flushed() found WRs not yet completed

  std::string failure_;
};

}  // namespace braid::transport::ibverbs
