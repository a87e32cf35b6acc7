// One peer of the ucx transport: the FIFOs of transport.h over tagged UCX
// messages, and the side-channel words. Internal to transports/ucx.
#pragma once

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/transport.h"
#include "transports/ucx/ucx_worker.h"

namespace braid::transport::ucx {

// ------------------------------------------------------------------ the tag
//
// Every message carries a 64-bit UCX tag:
//   [63:62] class   [61:40] communicator   [39:20] sender's rank   [19:0] sequence
// The class tells data from side-channel words. The communicator bits come
// from the job secret (and each communicator has a worker of its own), so
// two communicators in one process never match each other's messages; the
// sender's rank keeps peers apart. A receive for peer p matches class,
// communicator and rank (kSenderMask) and takes any sequence number: UCX
// matches one sender's messages in the order they were sent to receives in
// the order they were posted, so receive k gets data message k, and the
// sequence number (k mod 2^20) lets the receiver check that it did.
constexpr int kSeqBits = 20;
constexpr int kRankBits = 20;
constexpr int kCommBits = 22;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr uint64_t kSenderMask = ~kSeqMask;
enum class Class : uint64_t { Data = 0, Word = 1 };

inline uint64_t makeTag(Class cls, uint32_t comm, int rank, uint64_t seq) {
  return (static_cast<uint64_t>(cls) << 62) | (uint64_t{comm} << (kRankBits + kSeqBits)) |
         (static_cast<uint64_t>(rank) << kSeqBits) | (seq & kSeqMask);
}

// The communicator's bits of the tag, from the job secret all its ranks
// share.
uint32_t communicatorBits(uint64_t secret);

// A message's header, (bytes, tag) as in Message, travels as an 8-byte
// trailer right after the payload: so the UCX tag keeps all its bits for
// matching, the payload starts the slot (aligned for the reduction kernels,
// which read it in place), and the receiver checks the trailer against the
// length UCX reports before anyone reads the message.
struct Trailer {
  uint32_t bytes;
  uint32_t tag;
};

// Side-channel words, tagged Class::Word, 8 bytes each, about a rank: the
// sender is set up (kHello); it waits for that rank and goes on waiting
// (kWaitingFor); it gives up because that rank failed (kFailed), stopped
// answering (kTimedOut) or revoked the communicator (kRevoked), its last
// word; or it closes its communicator
// (kBye), its last word too, after which an endpoint error from its side
// is no failure.
enum WordKind : uint32_t {
  kHello = 0,
  kWaitingFor = 1,
  kFailed = 2,
  kTimedOut = 3,
  kBye = 4,
  kRevoked = 5
};
struct Word {
  uint32_t kind;
  int32_t rank;  // -1: none
};

// Zeroed memory aligned to 64 bytes, owned by its holder.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t bytes);
  std::byte* data() { return data_; }

 private:
  std::vector<std::byte> storage_;
  std::byte* data_;
};

// Request memory handed to UCX instead of its own (UCP_OP_ATTR_FIELD_REQUEST),
// so that no message allocates a request: `count` of them. UCX keeps a
// request's state in the requestSize bytes before the pointer it is given;
// a request's memory is reused once its completion callback has run.
class Requests {
 public:
  Requests(size_t requestSize, size_t count);
  void* at(size_t i) { return memory_.data() + i * stride_ + requestSize_; }

 private:
  size_t requestSize_;
  size_t stride_;
  AlignedBytes memory_;
};

// What the connections of one transport tell it.
class UcxConnection;
struct Shared {
  uint64_t activity = 0;  // bumped by every completion and change of state
  bool anyFailure = false;
  UcxConnection* firstFailed = nullptr;  // the connection that failed first
  bool trouble = false;                  // a UCX error came since the transport last looked
};

// The connection to one peer over the transport's worker. Owns its slot
// memory, its request memory, its endpoint (closed by the transport through
// startClose()) and the pidfd of a same-host peer's process. Completion
// callbacks run inside ucp_worker_progress(), or inside the call that posts
// an operation that completes at once (every operation is posted with
// UCP_OP_ATTR_FLAG_NO_IMM_CMPL, so each completion takes the callback).
// They never throw: a failure is recorded, and the transport's progress()
// throws it.
class UcxConnection final : public Connection {
 public:
  UcxConnection(Shared& shared, Worker& worker, int rank, int nranks, int peer, uint32_t comm,
                size_t slotBytes, size_t slots);
  ~UcxConnection() override;
  UcxConnection(const UcxConnection&) = delete;
  UcxConnection& operator=(const UcxConnection&) = delete;

  size_t slotBytes() const override { return slotBytes_; }
  std::byte* sendSlot(size_t) override {
    if (sendPosted_ - sendDone_ == slots_) return nullptr;
    return sendMemory_.data() + (sendPosted_ % slots_) * stride_;
  }
  void postSend(uint32_t bytes, uint32_t tag) override;
  const Message* peekRecv() override {
    return recvRead_ == recvFilled_ ? nullptr : &recvSlots_[recvRead_ % slots_].message;
  }
  // Hands the slot back to UCX as the next receive.
  void releaseRecv() override {
    ++recvRead_;
    if (!closed_ && failure_.empty() && ep_) postRecv();
  }
  // A message is done when a receive of the peer has taken it (see
  // postSend), or when the peer closed: then nobody will.
  bool flushed() const override { return sendDone_ == sendPosted_ || closed_; }
  bool peerClosed() const override { return closed_; }
  int failedRank() const override { return failedRank_; }
  GiveUpReason peerReason() const override { return peerReason_; }
  int peerWaitsFor() const override { return peerWaitsFor_; }

  int peer() const { return peer_; }
  const std::string& failure() const { return failure_; }
  bool heardHello() const { return heardHello_; }

  // Makes the endpoint to the peer's worker at `address` (error handling
  // mode PEER: a failure of the peer or of the path to it reaches
  // onEndpointError) and posts every receive. Returns "" or why not.
  std::string connect(const ucp_address_t* address);

  // A peer on this host, in this pid namespace: its process is watched
  // through a pidfd, because UCX notices a peer dead on shared memory only
  // by its keepalive, many seconds later. -1 when not watched.
  void watchProcess(pid_t pid);
  int pidFd() const { return pidFd_; }
  // The watched process exited: its connection is closed once its last
  // words are in (the caller drained the worker first), as a peer's whose
  // socket closed: an op that still needs it fails naming it, one that
  // has what it needs from it finishes, and messages to it still under way
  // are dropped (a peer that exited after its part may not have sent the
  // acknowledgements of the last ones). A peer that left unannounced after
  // rank `earlierLoss` (-1: none) did is taken to have given up on that
  // rank, with its word still on the way, and the failure names that rank.
  // (Survivors that UCX leaves waiting on each other then fail by the
  // transport's distrust.)
  void processExited(int earlierLoss);
  // The peer left without a last word (its process exited, or died).
  bool leftUnannounced() const { return leftUnannounced_; }
  // Fails the connection of a peer that left unannounced `ago`, for a
  // rank that has waited on the others since (UcxTransport's distrust).
  void failStillWaiting(std::chrono::milliseconds ago);

  void sayHello();
  // Queues the notice that this rank waits for `rank`; it goes out as soon
  // as memory for a word is free (a newer notice replaces one still queued).
  void noteWaitingFor(int rank);
  void sendNotice();
  // The last word: this rank gives up (kFailed, kTimedOut, kRevoked) or closes
  // (kBye). A give-up goes synchronously, so that lastWordInFlight() tells
  // whether the peer has it. Nothing is sent afterwards.
  void sayLastWord(Word word);
  bool lastWordInFlight() const { return wordsOut_[kWordsOut - 1].busy; }

  // Takes in the words that arrived and posts the next receive for them.
  // Returns true if any arrived.
  bool pumpWords();
  // Turns a UCX error on this connection into its failure, unless the
  // peer closed or gave up (its words are taken in first): then the error
  // only says that its side is gone. An error after rank `earlierLoss`
  // left unannounced (-1: none) is laid to that rank: UCX's handling of a
  // dead peer's endpoint can fail operations to others too (UCX 1.13 over
  // shared memory was seen cancelling a send to a live peer). An error on
  // the connection to a watched process waits up to kExitGrace for its
  // pidfd: a process that exits closes its sockets before its pidfd tells,
  // and one that exited after its part must not fail the op that has what
  // it needs from it.
  void settle(int earlierLoss, Clock::time_point now);
  // When settle() turns an error that waits for the pidfd into a failure;
  // Clock::time_point::max() when none waits.
  Clock::time_point settleBy() const;
  // The rank this connection's failure blames: its peer, or the rank whose
  // loss settle() laid it to.
  int blames() const { return blames_; }

  // For the transport's destructor. Closes the endpoint: by force where the
  // peer closed, this rank gave up or the connection failed, else flushing
  // what is in flight (the bye). Returns the request to wait for, or nullptr.
  void* startClose();
  // Cancels the receives still posted (their callbacks then run with
  // UCS_ERR_CANCELED).
  void cancelReceives();
  // Whether UCX still holds any of this connection's request memory.
  bool requestsOutstanding() const;

 private:
  // Memory for outgoing words: notices and the hello, and the last one
  // kept for the last word.
  static constexpr size_t kWordsOut = 4;
  // How long an error on the connection to a watched process waits for its
  // pidfd (see settle()). Exiting takes microseconds to milliseconds, more
  // when a loaded machine delays the threads of the process.
  static constexpr std::chrono::milliseconds kExitGrace{1000};

  struct SendSlot {
    enum State : uint8_t { Idle, Posted, Done } state = Idle;
    UcxConnection* owner = nullptr;
    uint64_t number = 0;  // the message's number in this FIFO
  };
  struct RecvSlot {
    enum State : uint8_t { Idle, Posted, Filled } state = Idle;
    UcxConnection* owner = nullptr;
    uint64_t number = 0;  // the message it receives
    Message message;
  };
  struct WordOut {
    UcxConnection* owner = nullptr;
    Word word{};
    bool busy = false;
  };
  struct WordIn {
    UcxConnection* owner = nullptr;
    Word word{};
    bool posted = false;
    bool arrived = false;
  };

  bool live() const { return ep_ && !closed_ && !saidLastWord_ && failure_.empty(); }
  void fail(const std::string& why);
  // A UCX error, which settle() turns into a failure unless the peer closed.
  void noteTrouble(ucs_status_t status);

  ucp_request_param_t requestParam(size_t request, void* user);
  // Request memory, in this order: the send slots', the receive slots',
  // the outgoing words', the incoming word's.
  size_t recvRequest(size_t slot) const { return slots_ + slot; }
  size_t wordRequest(size_t word) const { return 2 * slots_ + word; }
  size_t wordInRequest() const { return 2 * slots_ + kWordsOut; }

  void sent(SendSlot& slot, ucs_status_t status);
  void postRecv();
  void received(RecvSlot& slot, ucs_status_t status, const ucp_tag_recv_info_t* info);
  void sendWord(WordOut& out, Word word, bool synchronous);
  void postWordRecv();
  void take(const Word& word);

  static void onSent(void* request, ucs_status_t status, void* user);
  static void onReceived(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user);
  static void onWordSent(void* request, ucs_status_t status, void* user);
  static void onWordReceived(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                             void* user);
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  Shared& shared_;
  ucp_worker_h worker_;
  ucp_ep_h ep_ = nullptr;
  int rank_;
  int nranks_;
  int peer_;
  uint32_t comm_;
  size_t slotBytes_;
  size_t slots_;
  size_t stride_;  // a slot with its trailer, rounded up to 64 bytes

  // Send FIFO: messages [sendDone_, sendPosted_) are in flight (a callback
  // marks each done; sendDone_ moves over those done, in order).
  AlignedBytes sendMemory_;
  // Receive FIFO: [recvRead_, recvFilled_) hold unread messages; receives
  // up to recvPosted_ are posted (recvRead_ + slots once connected).
  AlignedBytes recvMemory_;
  std::vector<SendSlot> sendSlots_;
  std::vector<RecvSlot> recvSlots_;
  uint64_t sendPosted_ = 0;
  uint64_t sendDone_ = 0;
  uint64_t recvPosted_ = 0;
  uint64_t recvFilled_ = 0;
  uint64_t recvRead_ = 0;
  Requests requests_;

  std::array<WordOut, kWordsOut> wordsOut_;
  WordIn wordIn_;
  uint64_t wordsSent_ = 0;
  bool noticePending_ = false;
  int noticeRank_ = -1;

  bool leftUnannounced_ = false;
  int blames_ = -1;
  bool heardHello_ = false;
  bool closed_ = false;        // the peer said bye or gave up
  bool saidLastWord_ = false;  // nothing more is sent: bye or a give-up said
  bool gaveUp_ = false;        // this rank gave up (its endpoint closes by force)
  int failedRank_ = -1;        // whom the peer blamed when it gave up
  GiveUpReason peerReason_ = GiveUpReason::Failed;  // ...and why
  int peerWaitsFor_ = -1;          // whom the peer last said it is stuck waiting for
  ucs_status_t trouble_ = UCS_OK;  // the first UCX error on this connection
  Clock::time_point troubleAt_;    // ... and when it came
  std::string failure_;
  int pidFd_ = -1;
};

}  // namespace braid::transport::ucx
