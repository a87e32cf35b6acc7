#include "transports/ucx/ucx_connection.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "core/errors.h"
#include "core/log.h"
#include "transports/ucx/ucx_api.h"

namespace braid::transport::ucx {
namespace {

size_t roundUp(size_t value, size_t to) { return (value + to - 1) / to * to; }

}  // namespace

uint32_t communicatorBits(uint64_t secret) {
  secret ^= secret >> 31;
  secret *= 0x9e3779b97f4a7c15ull;
  secret ^= secret >> 29;
  return static_cast<uint32_t>(secret & ((uint64_t{1} << kCommBits) - 1));
}

AlignedBytes::AlignedBytes(size_t bytes) : storage_(bytes + 64) {
  const auto at = reinterpret_cast<uintptr_t>(storage_.data());
  data_ = storage_.data() + (64 - at % 64) % 64;
}

Requests::Requests(size_t requestSize, size_t count)
    : requestSize_(requestSize), stride_(roundUp(requestSize, 64)), memory_(stride_ * count) {}

UcxConnection::UcxConnection(Shared& shared, Worker& worker, int rank, int nranks, int peer,
                             uint32_t comm, size_t slotBytes, size_t slots)
    : shared_(shared),
      worker_(worker.handle()),
      rank_(rank),
      nranks_(nranks),
      peer_(peer),
      comm_(comm),
      slotBytes_(slotBytes),
      slots_(slots),
      stride_(roundUp(slotBytes + sizeof(Trailer), 64)),
      sendMemory_(stride_ * slots),
      recvMemory_(stride_ * slots),
      sendSlots_(slots),
      recvSlots_(slots),
      requests_(worker.requestSize(), 2 * slots + kWordsOut + 1) {
  for (SendSlot& slot : sendSlots_) slot.owner = this;
  for (RecvSlot& slot : recvSlots_) slot.owner = this;
  for (WordOut& word : wordsOut_) word.owner = this;
  wordIn_.owner = this;
}

UcxConnection::~UcxConnection() {
  if (pidFd_ >= 0) ::close(pidFd_);
}

// A synchronous tagged send: it completes once a receive the peer posted
// has taken the message (eager messages too), so the slot stays in flight
// until then: the peer's posted receives are this rank's credit, and a
// flushed() connection has nothing left that needs this rank's progress.
void UcxConnection::postSend(uint32_t bytes, uint32_t tag) {
  const uint64_t number = sendPosted_++;
  SendSlot& slot = sendSlots_[number % slots_];
  slot.number = number;
  std::byte* memory = sendMemory_.data() + (number % slots_) * stride_;
  const Trailer trailer{bytes, tag};
  std::memcpy(memory + bytes, &trailer, sizeof(trailer));
  slot.state = SendSlot::Posted;
  if (!live()) {  // nobody will read it
    sent(slot, UCS_OK);
    return;
  }
  ucp_request_param_t param = requestParam(number % slots_, &slot);
  param.cb.send = &UcxConnection::onSent;
  const ucs_status_ptr_t posted = api().tagSendSyncNbx(
      ep_, memory, bytes + sizeof(Trailer), makeTag(Class::Data, comm_, rank_, number), &param);
  if (UCS_PTR_IS_ERR(posted)) sent(slot, UCS_PTR_STATUS(posted));
}

std::string UcxConnection::connect(const ucp_address_t* address) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = address;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxConnection::onEndpointError;
  params.err_handler.arg = this;
  const ucs_status_t status = api().epCreate(worker_, &params, &ep_);
  if (status != UCS_OK) {
    ep_ = nullptr;
    return format("cannot make an endpoint to rank %d: %s", peer_, api().statusString(status));
  }
  for (size_t i = 0; i < slots_; ++i) postRecv();
  postWordRecv();
  return failure_;
}

void UcxConnection::watchProcess(pid_t pid) {
  pidFd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));  // -1 where unsupported
}

void UcxConnection::processExited(int earlierLoss) {
  ::close(pidFd_);
  pidFd_ = -1;
  pumpWords();
  if (!closed_) {
    leftUnannounced_ = true;
    if (earlierLoss >= 0 && earlierLoss != peer_) {
      failedRank_ = earlierLoss;
      blames_ = earlierLoss;
    }
  }
  closed_ = true;
  ++shared_.activity;
}

void UcxConnection::failStillWaiting(std::chrono::milliseconds ago) {
  fail(
      format("rank %d failed (its process exited without closing its communicator), and in "
             "the %lld ms since, this rank has waited for messages of the ranks still alive, "
             "which UCX may have lost",
             peer_, static_cast<long long>(ago.count())));
}

void UcxConnection::sayHello() {
  if (live()) sendWord(wordsOut_[0], {kHello, -1}, false);
}

void UcxConnection::noteWaitingFor(int rank) {
  noticeRank_ = rank;
  noticePending_ = true;
  sendNotice();
}

void UcxConnection::sendNotice() {
  if (!noticePending_ || !live()) return;
  for (size_t i = 0; i + 1 < kWordsOut; ++i)
    if (!wordsOut_[i].busy) {
      noticePending_ = false;
      sendWord(wordsOut_[i], {kWaitingFor, noticeRank_}, false);
      return;
    }
}

void UcxConnection::sayLastWord(Word word) {
  if (live()) sendWord(wordsOut_[kWordsOut - 1], word, word.kind != kBye);
  saidLastWord_ = true;
  gaveUp_ |= word.kind != kBye;
}

bool UcxConnection::pumpWords() {
  bool any = false;
  while (wordIn_.arrived) {
    wordIn_.arrived = false;
    any = true;
    take(wordIn_.word);
    if (!closed_ && failure_.empty()) postWordRecv();  // may complete at once
  }
  return any;
}

void UcxConnection::settle(int earlierLoss, Clock::time_point now) {
  if (trouble_ == UCS_OK || closed_ || !failure_.empty()) return;
  if (earlierLoss >= 0 && earlierLoss != peer_) {
    blames_ = earlierLoss;
    return fail(
        format("rank %d failed (its process exited), and then UCX failed an operation "
               "to peer %d: %s",
               earlierLoss, peer_, api().statusString(trouble_)));
  }
  if (now < settleBy()) return;
  fail(format("the connection to peer %d failed: %s (UCX)", peer_, api().statusString(trouble_)));
}

Clock::time_point UcxConnection::settleBy() const {
  if (trouble_ == UCS_OK || closed_ || !failure_.empty()) return Clock::time_point::max();
  return pidFd_ >= 0 ? troubleAt_ + kExitGrace : troubleAt_;
}

void* UcxConnection::startClose() {
  if (!ep_) return nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  const bool force = closed_ || gaveUp_ || trouble_ != UCS_OK || !failure_.empty();
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  const ucs_status_ptr_t closing = api().epCloseNbx(ep_, &param);
  ep_ = nullptr;
  return UCS_PTR_IS_PTR(closing) ? closing : nullptr;
}

void UcxConnection::cancelReceives() {
  for (size_t i = 0; i < slots_; ++i)
    if (recvSlots_[i].state == RecvSlot::Posted)
      api().requestCancel(worker_, requests_.at(recvRequest(i)));
  if (wordIn_.posted) api().requestCancel(worker_, requests_.at(wordInRequest()));
}

bool UcxConnection::requestsOutstanding() const {
  for (const SendSlot& slot : sendSlots_)
    if (slot.state == SendSlot::Posted) return true;
  for (const RecvSlot& slot : recvSlots_)
    if (slot.state == RecvSlot::Posted) return true;
  for (const WordOut& word : wordsOut_)
    if (word.busy) return true;
  return wordIn_.posted;
}

void UcxConnection::fail(const std::string& why) {
  if (!failure_.empty()) return;
  BRAID_DEBUG(Net, "ucx: %s", why.c_str());
  failure_ = why;
  if (blames_ < 0) blames_ = peer_;
  if (!shared_.firstFailed) shared_.firstFailed = this;
  shared_.anyFailure = true;
  ++shared_.activity;
}

void UcxConnection::noteTrouble(ucs_status_t status) {
  if (trouble_ == UCS_OK) {
    trouble_ = status;
    troubleAt_ = Clock::now();
  }
  shared_.trouble = true;
  ++shared_.activity;
}

ucp_request_param_t UcxConnection::requestParam(size_t request, void* user) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                       UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.request = requests_.at(request);
  param.user_data = user;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  return param;
}

void UcxConnection::onSent(void*, ucs_status_t status, void* user) {
  auto* slot = static_cast<SendSlot*>(user);
  slot->owner->sent(*slot, status);
}

void UcxConnection::sent(SendSlot& slot, ucs_status_t status) {
  slot.state = SendSlot::Done;
  ++shared_.activity;
  // braid cancels no send (but by closing at the end): a cancelled one did
  // not arrive.
  if (status != UCS_OK) noteTrouble(status);
  while (sendDone_ != sendPosted_) {
    const SendSlot& oldest = sendSlots_[sendDone_ % slots_];
    if (oldest.state != SendSlot::Done || oldest.number != sendDone_) break;
    ++sendDone_;
  }
}

void UcxConnection::postRecv() {
  const uint64_t number = recvPosted_++;
  RecvSlot& slot = recvSlots_[number % slots_];
  slot.number = number;
  slot.state = RecvSlot::Posted;
  ucp_request_param_t param = requestParam(recvRequest(number % slots_), &slot);
  param.cb.recv = &UcxConnection::onReceived;
  const ucs_status_ptr_t posted = api().tagRecvNbx(
      worker_, recvMemory_.data() + (number % slots_) * stride_, slotBytes_ + sizeof(Trailer),
      makeTag(Class::Data, comm_, peer_, 0), kSenderMask, &param);
  if (UCS_PTR_IS_ERR(posted)) {
    slot.state = RecvSlot::Idle;
    fail(format("posting a receive for peer %d failed: %s", peer_,
                api().statusString(UCS_PTR_STATUS(posted))));
  }
}

void UcxConnection::onReceived(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
                               void* user) {
  auto* slot = static_cast<RecvSlot*>(user);
  slot->owner->received(*slot, status, info);
}

// Checks the message against its trailer and its place in the FIFO, then
// publishes every message that is next in order.
void UcxConnection::received(RecvSlot& slot, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  slot.state = RecvSlot::Idle;
  if (status == UCS_ERR_CANCELED) return;
  ++shared_.activity;
  if (status == UCS_ERR_MESSAGE_TRUNCATED)
    return fail(format("peer %d sent a message larger than a %zu-byte slot", peer_, slotBytes_));
  if (status != UCS_OK) return noteTrouble(status);
  std::byte* memory = recvMemory_.data() + (slot.number % slots_) * stride_;
  if (info->length < sizeof(Trailer))
    return fail(
        format("peer %d sent a %zu-byte message, too short for its header", peer_, info->length));
  Trailer trailer{};
  std::memcpy(&trailer, memory + info->length - sizeof(Trailer), sizeof(Trailer));
  if (trailer.bytes != info->length - sizeof(Trailer))
    return fail(format("peer %d sent a %zu-byte message whose header says %u bytes", peer_,
                       info->length - sizeof(Trailer), trailer.bytes));
  if ((info->sender_tag & kSeqMask) != (slot.number & kSeqMask))
    return fail(format("peer %d's message %llu arrived in receive %llu: out of order", peer_,
                       static_cast<unsigned long long>(info->sender_tag & kSeqMask),
                       static_cast<unsigned long long>(slot.number & kSeqMask)));
  slot.message = {memory, trailer.bytes, trailer.tag};
  slot.state = RecvSlot::Filled;
  while (recvFilled_ != recvPosted_) {
    const RecvSlot& next = recvSlots_[recvFilled_ % slots_];
    if (next.state != RecvSlot::Filled || next.number != recvFilled_) break;
    ++recvFilled_;
  }
}

void UcxConnection::sendWord(WordOut& out, Word word, bool synchronous) {
  out.word = word;
  out.busy = true;
  ucp_request_param_t param =
      requestParam(wordRequest(static_cast<size_t>(&out - wordsOut_.data())), &out);
  param.cb.send = &UcxConnection::onWordSent;
  const uint64_t tag = makeTag(Class::Word, comm_, rank_, wordsSent_++);
  const ucs_status_ptr_t posted =
      synchronous ? api().tagSendSyncNbx(ep_, &out.word, sizeof(Word), tag, &param)
                  : api().tagSendNbx(ep_, &out.word, sizeof(Word), tag, &param);
  if (UCS_PTR_IS_ERR(posted)) {
    out.busy = false;
    noteTrouble(UCS_PTR_STATUS(posted));
  }
}

void UcxConnection::onWordSent(void*, ucs_status_t status, void* user) {
  auto* out = static_cast<WordOut*>(user);
  out->busy = false;
  ++out->owner->shared_.activity;
  if (status != UCS_OK) out->owner->noteTrouble(status);
}

void UcxConnection::postWordRecv() {
  wordIn_.posted = true;
  ucp_request_param_t param = requestParam(wordInRequest(), &wordIn_);
  param.cb.recv = &UcxConnection::onWordReceived;
  const ucs_status_ptr_t posted =
      api().tagRecvNbx(worker_, &wordIn_.word, sizeof(Word), makeTag(Class::Word, comm_, peer_, 0),
                       kSenderMask, &param);
  if (UCS_PTR_IS_ERR(posted)) {
    wordIn_.posted = false;
    noteTrouble(UCS_PTR_STATUS(posted));
  }
}

void UcxConnection::onWordReceived(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
                                   void* user) {
  auto* in = static_cast<WordIn*>(user);
  UcxConnection& self = *in->owner;
  in->posted = false;
  if (status == UCS_ERR_CANCELED) return;
  ++self.shared_.activity;
  if (status != UCS_OK && status != UCS_ERR_MESSAGE_TRUNCATED) return self.noteTrouble(status);
  if (status != UCS_OK || info->length != sizeof(Word))
    return self.fail(format("peer %d sent a malformed word", self.peer_));
  in->arrived = true;
}

void UcxConnection::take(const Word& word) {
  if (word.rank < -1 || word.rank >= nranks_)
    return fail(format("peer %d sent a word about rank %d, which does not exist", peer_,
                       static_cast<int>(word.rank)));
  switch (word.kind) {
    case kHello:
      heardHello_ = true;
      return;
    case kWaitingFor:
      peerWaitsFor_ = word.rank;
      return;
    case kFailed:
    case kTimedOut:
    case kRevoked:
      failedRank_ = word.rank;
      peerReason_ = word.kind == kTimedOut  ? GiveUpReason::TimedOut
                    : word.kind == kRevoked ? GiveUpReason::Revoked
                                            : GiveUpReason::Failed;
      closed_ = true;
      return;
    case kBye:
      closed_ = true;
      return;
    default:
      fail(format("peer %d sent a word of unknown kind %u", peer_, word.kind));
  }
}

void UcxConnection::onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<UcxConnection*>(arg)->noteTrouble(status);
}

}  // namespace braid::transport::ucx
