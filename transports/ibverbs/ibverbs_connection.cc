#include "transports/ibverbs/ibverbs_connection.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"

namespace braid::transport::ibverbs {
namespace {

size_t roundUp(size_t value, size_t to) { return (value + to - 1) / to * to; }

}  // namespace

IbConnection::IbConnection(Shared& shared, VerbsBackend& backend, ProtectionDomain* pd,
                           CompletionQueue* cq, Connection& control, int rank, int peer,
                           size_t slotBytes, size_t slots, int qps, const PathOptions& path)
    : shared_(shared),
      backend_(backend),
      pd_(pd),
      control_(control),
      rank_(rank),
      peer_(peer),
      slotBytes_(slotBytes),
      slots_(slots),
      stride_(roundUp(slotBytes + sizeof(Trailer), 64)),
      signalEvery_(std::max<uint64_t>(1, slots / (2 * static_cast<size_t>(qps)))),
      creditEvery_(std::max<uint64_t>(1, slots / 2)),
      qps_(static_cast<size_t>(qps)),
      sentParts_(slots * kMaxQps),
      partCount_(slots),
      recvSlots_(slots) {
  try {
    recvMemory_ = static_cast<std::byte*>(backend_.allocateTarget(stride_ * slots_));
    sendMemory_ = static_cast<std::byte*>(backend_.allocateTarget(stride_ * slots_));
    recvRegion_ = backend_.registerMemory(pd_, recvMemory_, stride_ * slots_,
                                          kLocalWrite | kRemoteWrite, &recvKeys_);
    sendRegion_ =
        backend_.registerMemory(pd_, sendMemory_, stride_ * slots_, kLocalWrite, &sendKeys_);
    for (size_t i = 0; i < qps_.size(); ++i) {
      Qp& qp = qps_[i];
      qp.sendDepth = sendDepthFor(slots_, qps);
      qp.receives = receivesFor(slots_, static_cast<int>(i));
      QpCaps caps;
      caps.sendDepth = qp.sendDepth;
      caps.recvDepth = qp.receives;
      qp.handle = backend_.createQp(pd_, cq, cq, caps, &qp.num);
      qp.psn = (qp.num * 2654435761u + static_cast<uint32_t>(rank_)) & 0xffffff;
      backend_.toInit(qp.handle, path);
    }
  } catch (...) {
    release();
    throw;
  }
}

IbConnection::~IbConnection() { release(); }

// A data part of each message in flight, the unsignaled WRs before a
// signaled one, credit (which leaves one entry for data) and the flushing
// write.
int IbConnection::sendDepthFor(size_t slots, int qps) {
  const size_t signalEvery = std::max<size_t>(1, slots / (2 * static_cast<size_t>(qps)));
  return static_cast<int>(slots + signalEvery) + 8;
}

int IbConnection::receivesFor(size_t slots, int qp) {
  return static_cast<int>(slots) + (qp == 0 ? static_cast<int>(slots) + kCreditSpare : 0);
}

void IbConnection::release() {
  destroyQps();
  if (sendRegion_) backend_.deregister(sendRegion_);
  if (recvRegion_) backend_.deregister(recvRegion_);
  if (sendMemory_) backend_.releaseTarget(sendMemory_, stride_ * slots_);
  if (recvMemory_) backend_.releaseTarget(recvMemory_, stride_ * slots_);
  sendRegion_ = recvRegion_ = nullptr;
  sendMemory_ = recvMemory_ = nullptr;
}

void IbConnection::destroyQps() {
  for (Qp& qp : qps_)
    if (qp.handle) {
      backend_.destroyQp(qp.handle);
      qp.handle = nullptr;
    }
}

EndpointInfo IbConnection::local(uint16_t lid, const Gid& gid, bool useGid, int mtu) const {
  EndpointInfo info;
  info.lid = lid;
  info.gid = gid;
  info.useGid = useGid;
  info.mtu = static_cast<uint32_t>(mtu);
  for (const Qp& qp : qps_) {
    info.qpNums.push_back(qp.num);
    info.psns.push_back(qp.psn);
  }
  info.fifoAddress = reinterpret_cast<uint64_t>(recvMemory_);
  info.fifoRkey = recvKeys_.rkey;
  info.slots = static_cast<uint32_t>(slots_);
  info.slotBytes = static_cast<uint32_t>(slotBytes_);
  return info;
}

void IbConnection::connect(const EndpointInfo& remote, const PathOptions& path) {
  if (remote.qpNums.size() != qps_.size() || remote.slots != slots_ ||
      remote.slotBytes != slotBytes_)
    braid::fail(
        ErrorCode::InvalidArgument, rank_,
        format("peer %d's verbs end has %zu QPs and %u slots of %u bytes, this rank's %zu of "
               "%zu bytes: every rank must set BRAID_IB_QPS_PER_CONNECTION, BRAID_SLOTS and "
               "BRAID_SLOT_BYTES alike",
               peer_, remote.qpNums.size(), remote.slots, remote.slotBytes, qps_.size(),
               slotBytes_));
  remoteFifo_ = remote.fifoAddress;
  remoteRkey_ = remote.fifoRkey;
  PathOptions mine = path;
  mine.mtu = std::min(path.mtu, static_cast<int>(remote.mtu));
  for (size_t i = 0; i < qps_.size(); ++i) {
    Qp& qp = qps_[i];
    RemoteQp to;
    to.qpNum = remote.qpNums[i];
    to.psn = remote.psns[i];
    to.lid = remote.lid;
    to.gid = remote.gid;
    to.useGid = remote.useGid;
    backend_.toRtr(qp.handle, to, mine);
    mine.psn = qp.psn;
    backend_.toRts(qp.handle, mine);
    qp.reposts = qp.receives;
  }
  repost();
  if (!failure_.empty()) braid::fail(ErrorCode::SystemError, rank_, failure_);
}

std::byte* IbConnection::sendSlot(size_t) {
  // A closed peer reads nothing more: its messages are dropped as posted.
  if (peerClosed()) {
    sendDone_ = sendPosted_;
    return sendMemory_ + (sendPosted_ % slots_) * stride_;
  }
  if (sendPosted_ - sendDone_ == slots_) return nullptr;
  if (sendPosted_ - peerReleased_ >= slots_) return nullptr;
  for (const Qp& qp : qps_)
    if (!hasRoom(qp)) return nullptr;
  return sendMemory_ + (sendPosted_ % slots_) * stride_;
}

void IbConnection::postSend(uint32_t bytes, uint32_t tag) {
  const uint64_t number = sendPosted_++;
  const size_t slot = number % slots_;
  std::byte* memory = sendMemory_ + slot * stride_;
  const Trailer trailer{bytes, tag};
  std::memcpy(memory + bytes, &trailer, sizeof(trailer));
  partCount_[slot] = 0;
  if (!failure_.empty() || peerClosed()) return;  // nobody will read it
  // Parts of at least kMinPartBytes, on as many QPs as that makes.
  const size_t total = bytes + sizeof(Trailer);
  size_t parts = std::min(qps_.size(), std::max<size_t>(1, total / kMinPartBytes));
  const size_t partBytes = roundUp((total + parts - 1) / parts, 64);
  parts = (total + partBytes - 1) / partBytes;
  for (size_t j = 0; j < parts; ++j) {
    const size_t offset = j * partBytes;
    const auto q = static_cast<uint16_t>((number + j) % qps_.size());
    Qp& qp = qps_[q];
    SendRequest request;
    request.opcode = Opcode::WriteWithImm;
    request.local = memory + offset;
    request.lkey = sendKeys_.lkey;
    request.bytes = static_cast<uint32_t>(std::min(partBytes, total - offset));
    request.remoteAddr = remoteFifo_ + slot * stride_ + offset;
    request.rkey = remoteRkey_;
    request.imm = static_cast<uint32_t>(((number & kImmSeqMask) << 4) | (parts - 1));
    sentParts_[slot * kMaxQps + j] = {q, qp.posted};
    if (!post(qp, request, false)) return;
    ++partCount_[slot];
    ++qp.dataParts;
  }
}

std::vector<uint64_t> IbConnection::stripePosts() const {
  std::vector<uint64_t> posts;
  if (qps_.size() > 1)
    for (const Qp& qp : qps_) posts.push_back(qp.dataParts);
  return posts;
}

bool IbConnection::post(Qp& qp, SendRequest request, bool signal) {
  request.signaled = signal || qp.posted + 1 - qp.lastSignaled >= signalEvery_;
  request.wrId = qp.posted;
  const int error = backend_.postSend(qp.handle, &request, 1);
  if (error != 0) {
    fail(format("posting a send on QP %u to peer %d failed: %s", qp.num, peer_,
                std::strerror(error)));
    return false;
  }
  ++qp.posted;
  if (request.signaled) qp.lastSignaled = qp.posted;
  return true;
}

void IbConnection::releaseRecv() {
  RecvSlot& slot = recvSlots_[recvRead_ % slots_];
  slot.partsArrived = slot.partsExpected = 0;
  slot.bytes = 0;
  ++recvRead_;
  if (recvRead_ - advertised_ >= creditEvery_) {
    creditPending_ = true;
    postCredit();
  }
}

void IbConnection::creditAll() {
  if (recvRead_ == advertised_) return;
  creditPending_ = true;
  postCredit();
}

bool IbConnection::flushed() const {
  if (peerClosed() || !failure_.empty()) return true;
  bool done = !creditPending_;
  for (const Qp& qp : qps_) done &= qp.retired == qp.posted || qp.broken;
  if (!done) flushWanted_ = true;
  return done;
}

void IbConnection::postCredit() {
  Qp& qp = qps_[0];
  // One entry stays free for data, which sendSlot() found room for.
  if (!creditPending_ || !failure_.empty() || peerClosed() || !hasRoom(qp, 2)) return;
  SendRequest request;
  request.opcode = Opcode::WriteWithImm;
  request.bytes = 0;
  request.local = sendMemory_;
  request.lkey = sendKeys_.lkey;
  request.remoteAddr = remoteFifo_;
  request.rkey = remoteRkey_;
  request.imm = kCreditFlag | static_cast<uint32_t>(recvRead_ & kImmCreditMask);
  if (!post(qp, request, false)) return;
  advertised_ = recvRead_;
  creditPending_ = false;
  ++shared_.activity;
}

bool IbConnection::repost() {
  bool any = false;
  constexpr int kBatch = 16;
  RecvRequest requests[kBatch];
  for (Qp& qp : qps_) {
    while (qp.reposts > 0 && failure_.empty() && !qp.broken) {
      const int count = std::min(qp.reposts, kBatch);
      for (int i = 0; i < count; ++i) requests[i].wrId = kRecvWr;
      const int error = backend_.postRecv(qp.handle, requests, static_cast<size_t>(count));
      if (error != 0) {
        fail(format("posting receives on QP %u for peer %d failed: %s", qp.num, peer_,
                    std::strerror(error)));
        break;
      }
      qp.reposts -= count;
      any = true;
    }
  }
  if (creditPending_) {
    postCredit();
    any |= !creditPending_;
  }
  if (flushWanted_ && failure_.empty() && !peerClosed()) {
    flushWanted_ = false;
    for (Qp& qp : qps_)
      if (qp.posted > qp.lastSignaled && hasRoom(qp)) {
        SendRequest request;
        request.opcode = Opcode::Write;
        request.local = sendMemory_;
        request.lkey = sendKeys_.lkey;
        request.remoteAddr = remoteFifo_;
        request.rkey = remoteRkey_;
        any |= post(qp, request, true);
      }
  }
  return any;
}

void IbConnection::complete(int q, const Completion& completion) {
  ++shared_.activity;
  Qp& qp = qps_[static_cast<size_t>(q)];
  const bool receive = (completion.wrId & kRecvWr) != 0;
  if (completion.status != WcStatus::Success) {
    qp.broken = true;  // in the error state: its receives are not posted again
    // After a peer said bye or gave up, its end going away is no failure.
    if (peerClosed()) return;
    const char* hint = wcStatusHint(completion.status);
    fail(format("the connection to peer %d failed: QP %u: %s (vendor error %u)%s%s", peer_, qp.num,
                wcStatusName(completion.status), completion.vendorError, *hint ? ": " : "", hint));
    return;
  }
  if (receive) return received(q, completion);
  qp.retired = std::max(qp.retired, completion.wrId + 1);
  retireSends();
}

void IbConnection::retireSends() {
  while (sendDone_ != sendPosted_) {
    const size_t slot = sendDone_ % slots_;
    bool done = true;
    for (size_t j = 0; j < partCount_[slot] && done; ++j) {
      const SentPart& part = sentParts_[slot * kMaxQps + j];
      done = part.wr < qps_[part.qp].retired;
    }
    if (!done) break;
    ++sendDone_;
  }
}

void IbConnection::received(int q, const Completion& completion) {
  ++qps_[static_cast<size_t>(q)].reposts;
  const uint32_t imm = completion.imm;
  if (imm & kCreditFlag) {
    // The peer's release count, mod 2^31, can only grow, up to what was sent.
    const uint64_t released =
        peerReleased_ + ((uint64_t{imm & ~kCreditFlag} - peerReleased_) & kImmCreditMask);
    if (released > sendPosted_ || completion.bytes != 0)
      return fail(format("peer %d credited %llu messages of %u bytes, but %llu were sent", peer_,
                         static_cast<unsigned long long>(released), completion.bytes,
                         static_cast<unsigned long long>(sendPosted_)));
    peerReleased_ = released;
    return;
  }
  const uint64_t number = recvFilled_ + (((imm >> 4) - recvFilled_) & kImmSeqMask);
  const int parts = static_cast<int>(imm & 15) + 1;
  if (number - recvRead_ >= slots_ || static_cast<size_t>(parts) > qps_.size())
    return fail(
        format("peer %d wrote message %llu (in %d parts) while this rank has read %llu "
               "of %zu slots: out of order",
               peer_, static_cast<unsigned long long>(number), parts,
               static_cast<unsigned long long>(recvRead_), slots_));
  // A receive completion of an RDMA WRITE_WITH_IMM carries the bytes that
  // write placed (byte_len), as RC devices report it; the trailer checks
  // the sum.
  RecvSlot& slot = recvSlots_[number % slots_];
  if (slot.partsArrived == 0) slot.partsExpected = parts;
  if (slot.partsExpected != parts || slot.bytes + completion.bytes > stride_)
    return fail(format("peer %d's message %llu arrived in parts that do not add up", peer_,
                       static_cast<unsigned long long>(number)));
  ++slot.partsArrived;
  slot.bytes += completion.bytes;
  if (slot.partsArrived < slot.partsExpected) return;
  std::byte* memory = recvMemory_ + (number % slots_) * stride_;
  Trailer trailer{};
  if (slot.bytes < sizeof(Trailer))
    return fail(
        format("peer %d sent a %u-byte message, too short for its header", peer_, slot.bytes));
  std::memcpy(&trailer, memory + slot.bytes - sizeof(Trailer), sizeof(Trailer));
  if (trailer.bytes != slot.bytes - sizeof(Trailer) || trailer.bytes > slotBytes_)
    return fail(format("peer %d sent a %zu-byte message whose header says %u bytes", peer_,
                       slot.bytes - sizeof(Trailer), trailer.bytes));
  slot.message = {memory, trailer.bytes, trailer.tag};
  while (recvFilled_ - recvRead_ < slots_) {
    const RecvSlot& next = recvSlots_[recvFilled_ % slots_];
    if (next.partsExpected == 0 || next.partsArrived < next.partsExpected) break;
    ++recvFilled_;
  }
}

void IbConnection::qpFailed(int q, const char* what) {
  if (peerClosed()) return;
  fail(format("the connection to peer %d failed: QP %u: %s", peer_,
              qps_[static_cast<size_t>(q)].num, what));
}

void IbConnection::fail(const std::string& why) {
  if (!failure_.empty()) return;
  failure_ = why;
  shared_.anyFailure = true;
  ++shared_.activity;
}

}  // namespace braid::transport::ibverbs
