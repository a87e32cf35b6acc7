// The CPU executor's run loop: lanes advanced piece by piece over the
// transports' connections, idle waits (spin, yield, sleep), pieces lent by
// reference, and the errors that name the rank to blame.
#include "exec/cpu_executor.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "braid/error.h"
#include "core/cpu_relax.h"
#include "core/errors.h"
#include "core/log.h"
#include "reduce/streaming.h"

namespace braid::exec {
namespace {

using algo::receives;
using algo::sends;
using algo::StepKind;

// An idle executor first spins (the peer is usually a few hundred
// nanoseconds away), then spins yielding its core (the peer may need it),
// then sleeps in the transports. The longest single sleep bounds how late
// abort() is noticed.
constexpr Clock::duration kPureSpin = std::chrono::microseconds(5);
// A peer that answers within this long is probably running on another core.
constexpr Clock::duration kQuickAnswer = std::chrono::microseconds(2);
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kLongestSleep = std::chrono::milliseconds(10);
// Two ranks that wake each other through the transports' sleeps can stay
// on one CPU for thousands of messages (the scheduler places a woken thread
// near its waker), each then waiting for the other to be switched out: a
// few microseconds a message instead of a few hundred nanoseconds. A rank
// that finds a lower-ranked peer on its own CPU, on a host with a core per
// rank, moves to another CPU it may use (leaveSharedCpu), at most this
// often.
constexpr auto kLeaveInterval = std::chrono::milliseconds(1);
// How often a waiting op looks for a revoke that any peer announced.
constexpr auto kRevokeCheck = std::chrono::milliseconds(1);
// Idle turns spun before the clock is first read (about a microsecond).
constexpr unsigned kUncountedTurns = 32;

// One turn of a wait that cannot block on every transport at once.
constexpr auto kShortSleep = std::chrono::microseconds(200);

// Each lane's scratch area starts at a multiple of this (a cache line) in
// the executor's block.
constexpr size_t kScratchAlignment = 64;

}  // namespace

Executor::Executor(transport::Wiring& wiring, int rank, size_t pieceBytes, bool spinFirst,
                   size_t referenceBytes, const std::atomic<bool>& revoked)
    : wiring_(wiring),
      rank_(rank),
      pieceBytes_(pieceBytes),
      spinFirst_(spinFirst),
      pureSpin_(spinFirst ? kPureSpin : Clock::duration::zero()),
      referenceBytes_(referenceBytes),
      revoked_(revoked) {
  // Nothing to wait for on this rank's loopback: its messages are its own.
  const transport::Transport* loopback = wiring_.transportOf[static_cast<size_t>(rank)];
  for (auto& transport : wiring_.transports) {
    if (transport.get() != loopback) waitable_.push_back(transport.get());
    if (!transport->passive()) active_.push_back(transport.get());
  }
  // A passive transport's posted message is already the peer's.
  for (size_t peer = 0; peer < wiring_.connections.size(); ++peer) {
    if (!wiring_.transportOf[peer]->passive())
      unflushable_.push_back({wiring_.connections[peer], static_cast<int>(peer)});
    if (static_cast<int>(peer) != rank_ && wiring_.connections[peer]->carriesAddresses())
      carriesAddresses_ = true;
  }
}

void Activity::describe(const OpInfo& info, size_t stepCount, size_t laneCount) {
  constexpr auto relaxed = std::memory_order_relaxed;
  seq.store(info.seq, relaxed);
  count.store(info.count, relaxed);
  type.store(static_cast<int>(info.type), relaxed);
  op.store(static_cast<int>(info.op), relaxed);
  reduces.store(info.reduces, relaxed);
  root.store(info.root, relaxed);
  peer.store(info.peer, relaxed);
  lanes.store(laneCount, relaxed);
  steps.store(stepCount, relaxed);
  step.store(0, relaxed);
  recvPeer.store(-1, relaxed);
  sendPeer.store(-1, relaxed);
  waitingSince.store(0, relaxed);
  name.store(info.name, std::memory_order_release);
}

std::string OpInfo::describe() const {
  std::string text = format("%s #%llu (count %zu, %s", name, static_cast<unsigned long long>(seq),
                            count, dataTypeName(type));
  if (reduces) text += format(", %s", reduceOpName(op));
  if (root >= 0) text += format(", root %d", root);
  if (peer >= 0) text += format(", peer %d", peer);
  return text + ")";
}

bool Executor::lendable(const Lane& lane, const algo::Step& step, bool inputSettled) const {
  // The input only where no op of the group writes it; the output only
  // where the plan says the data is settled, and only from steps that
  // stream several pieces. A peer that read this rank's output keeps its
  // cache lines, so the next op's writes there must first take them back;
  // with one piece per step nothing hides that (measured with braid-perf
  // -R 1: in-place all-reduce of 256 KiB at 2 ranks ran 3x slower lending
  // its output, while ops of 1 MiB and up gained).
  const algo::Buffer buffer = step.kind == StepKind::Send ? step.src : step.dst;
  if (buffer == algo::Buffer::Input) return inputSettled;
  return buffer == algo::Buffer::Output && step.settled && step.count * lane.elemSize > pieceBytes_;
}

const memory::Region* Executor::lentFrom(const Lane& lane, const algo::Step& step,
                                         const std::byte* data, size_t bytes,
                                         const transport::Connection& out) const {
  if (referenceBytes_ == 0 || bytes < referenceBytes_ || !out.carriesReferences()) return nullptr;
  // (The communicator sets inputRegion only where the input is settled.)
  if (!lendable(lane, step, true)) return nullptr;
  const algo::Buffer buffer = step.kind == StepKind::Send ? step.src : step.dst;
  const memory::Region* region =
      buffer == algo::Buffer::Input ? &lane.inputRegion : &lane.outputRegion;
  return *region && region->contains(data, bytes) ? region : nullptr;
}

bool Executor::lentByAddress(const Lane& lane, const algo::Step& step, const std::byte* data,
                             size_t bytes, const transport::Connection& out) const {
  return addressFrom_ != 0 && bytes >= addressFrom_ && data && out.carriesAddresses() &&
         lendable(lane, step, lane.inputSettled);
}

bool Executor::allReturned() {
  for (size_t i = 0; i < lent_.size();) {
    if (lent_[i].connection->consumed(lent_[i].ticket)) {
      lent_[i] = lent_.back();
      lent_.pop_back();
    } else {
      ++i;
    }
  }
  return lent_.empty();
}

void Executor::noteLent(const transport::Connection* connection, uint64_t ticket, int peer) {
  for (Lent& lent : lent_)
    if (lent.connection == connection) {
      lent.ticket = ticket;  // a connection's messages are released in order
      return;
    }
  lent_.push_back({connection, ticket, peer});
}

std::byte* Executor::stagingFor(const std::byte* source, size_t bytes) {
  constexpr uintptr_t kPage = 4096;
  const size_t need = std::max(bytes, pieceBytes_) + 2 * kPage;
  if (staging_.size() < need) staging_.resize(need);
  const uintptr_t base = reinterpret_cast<uintptr_t>(staging_.data());
  const uintptr_t page = (base + kPage - 1) / kPage * kPage;
  return staging_.data() + (page - base) + reinterpret_cast<uintptr_t>(source) % kPage;
}

// Moves as many pieces of the lane's current step as its connections take
// now; true when anything moved. This is the hot path: per piece it takes
// no lock, makes no system call of its own and allocates nothing (lent_,
// which noteLent() fills, keeps its capacity from op to op). Over shm the
// connection's calls are loads and stores in the shared segment (a futex
// wake only when the peer sleeps, and a lent region is mapped by its
// receiver once, at the first piece that refers to it).
bool Executor::advance(Lane& lane) {
  const auto& steps = lane.plan->steps;
  if (lane.step == steps.size()) return false;
  const algo::Step& step = steps[lane.step];
  // Direct plans are for device buffers that peers map (Shape::mapped),
  // which host ops never have.
  if (step.kind == StepKind::Signal || algo::direct(step.kind))
    throw Error(ErrorCode::Internal, "a direct step in a plan for host buffers");
  const size_t total = step.count * lane.elemSize;
  // Only the buffers a step uses are touched (non-roots may pass null ones).
  const bool reads = readsSrc(step.kind), writes = writesDst(step.kind);
  const std::byte* src =
      reads ? bufferOf(lane, step.src) + step.srcOffset * lane.elemSize : nullptr;
  std::byte* dst = writes ? bufferOf(lane, step.dst) + step.dstOffset * lane.elemSize : nullptr;

  if (step.kind == StepKind::Copy || step.kind == StepKind::Reduce) {
    if (step.kind == StepKind::Reduce)
      lane.kernel(dst, dst, src, step.count);
    else if (src + total <= dst || dst + total <= src)
      reduce::copy(dst, src, total);
    else if (src != dst)
      std::memmove(dst, src, total);
    if (step.finalize) reduce::finalize(dst, step.count, lane.type, lane.op, lane.nranks);
    ++lane.step;
    return true;
  }

  transport::Connection* in = receives(step.kind) ? wiring_.connections[step.recvPeer] : nullptr;
  transport::Connection* out = sends(step.kind) ? wiring_.connections[step.sendPeer] : nullptr;
  bool moved = false;
  while (lane.done < total) {
    const size_t piece = std::min(pieceBytes_, total - lane.done);
    const std::byte* mine = reads ? src + lane.done : nullptr;
    std::byte* result = writes ? dst + lane.done : nullptr;
    const transport::Message* message = nullptr;
    if (in) {
      message = in->peekRecv();
      if (!message) {
        if (in->peerClosed()) failClosed(*lane.info, step.recvPeer, "waits for its data");
        break;
      }
      if (message->bytes != piece || message->tag != lane.tag)
        fail(ErrorCode::Internal, rank_,
             format("%s: peer %d sent a %u-byte message with tag %08x where this rank expected "
                    "%zu bytes with tag %08x: the ranks did not issue the same operations",
                    lane.info->describe().c_str(), step.recvPeer, message->bytes, message->tag,
                    piece, lane.tag));
    }
    std::byte* slotMemory = nullptr;
    if (out) {
      slotMemory = out->sendSlot(piece);
      if (!slotMemory) {
        if (out->peerClosed()) failClosed(*lane.info, step.sendPeer, "sends to it");
        break;
      }
    }
    // What this piece sends, when it can go by reference or by address.
    const memory::Region* region = nullptr;
    const std::byte* sent = nullptr;
    bool byAddress = false;
    if (out) {
      sent = step.kind == StepKind::Send ? mine : result;
      region = lentFrom(lane, step, sent, piece, *out);
      byAddress = !region && lentByAddress(lane, step, sent, piece, *out);
    }
    const bool lent = region || byAddress;
    // The peer's bytes, here. One that came by address is read where this
    // piece keeps it: received, into the result, unless the kernel's copy
    // would be slow there (reduce::copiesSlowly); else staged.
    const std::byte* theirs = message ? message->data : nullptr;
    const bool readInto = message && message->remote &&
                          (step.kind == StepKind::Recv || step.kind == StepKind::RecvCopySend) &&
                          !reduce::copiesSlowly(result, message->data);
    if (message && message->remote) {
      std::byte* to = readInto ? result : stagingFor(message->data, piece);
      if (!in->readRemote(to, message->data, piece))
        failClosed(*lane.info, step.recvPeer, "reads the data it lent");
      theirs = to;
    }
    const size_t elems = piece / lane.elemSize;
    // A reduction streams its result only where it writes apart from its
    // own input, and only what is final (Avg then divides it in place).
    const bool streamResult =
        lane.streamOutput && result != mine && !(step.finalize && lane.op == ReduceOp::Avg);
    // What goes into the slot, with streaming stores where chosen.
    const bool streamSlot = streamSlots_ && out && !lent;
    auto toSlot = [&](const std::byte* from) {
      if (streamSlot)
        reduce::copyStreaming(slotMemory, from, piece);
      else
        reduce::copy(slotMemory, from, piece);
    };
    switch (step.kind) {
      case StepKind::Send:
        if (!lent) toSlot(mine);
        break;
      case StepKind::Recv:
        if (readInto) break;  // already in the result
        if (lane.streamOutput)
          reduce::copyStreaming(result, theirs, piece);
        else
          reduce::copy(result, theirs, piece);
        break;
      case StepKind::RecvReduceSend:
        if (streamSlot)
          reduce::reduceStreaming(lane.kernel, slotMemory, theirs, mine, elems, lane.elemSize);
        else
          lane.kernel(slotMemory, theirs, mine, elems);
        break;
      case StepKind::RecvReduceCopy:
        if (streamResult)
          reduce::reduceStreaming(lane.kernel, result, theirs, mine, elems, lane.elemSize);
        else
          lane.kernel(result, theirs, mine, elems);
        if (step.finalize) reduce::finalize(result, elems, lane.type, lane.op, lane.nranks);
        break;
      case StepKind::RecvReduceCopySend:
        if (streamResult && streamSlot) {  // both past the cache
          reduce::reduceStreaming(lane.kernel, result, theirs, mine, elems, lane.elemSize,
                                  slotMemory);
          break;
        }
        if (streamResult && !lent) {  // into the slot, and from there past the cache
          reduce::reduceStreaming(lane.kernel, result, theirs, mine, elems, lane.elemSize,
                                  slotMemory, reduce::Also::Cached);
          break;
        }
        if (!lent && !streamSlot) {  // into the result and the slot, a block at a time
          reduce::reduceCopying(lane.kernel, result, theirs, mine, elems, lane.type, lane.op,
                                step.finalize ? lane.nranks : 1, slotMemory);
          break;
        }
        lane.kernel(result, theirs, mine, elems);
        if (step.finalize) reduce::finalize(result, elems, lane.type, lane.op, lane.nranks);
        if (!lent) toSlot(result);
        break;
      case StepKind::RecvCopySend:
        if (!readInto && lane.streamOutput)
          reduce::copyStreaming(result, theirs, piece);
        else if (!readInto)
          reduce::copy(result, theirs, piece);
        if (!lent) toSlot(theirs);  // (read into the result: from there)
        break;
      case StepKind::Copy:
      case StepKind::Reduce:
      case StepKind::Signal:  // (refused above)
      case StepKind::ReduceFrom:
      case StepKind::CopyTo:
      case StepKind::CopyFrom:
        break;
    }
    if (region) {
      const uint64_t ticket = out->postReference(*region, static_cast<size_t>(sent - region->base),
                                                 static_cast<uint32_t>(piece), lane.tag);
      noteLent(out, ticket, step.sendPeer);
      ++piecesSentByReference_;
    } else if (byAddress) {
      noteLent(out, out->postAddress(sent, static_cast<uint32_t>(piece), lane.tag), step.sendPeer);
      ++piecesSentByAddress_;
    } else if (out) {
      out->postSend(static_cast<uint32_t>(piece), lane.tag);
      piecesStreamedToSlots_ += streamSlot;
    }
    // Borrowed bytes were the peer's only while its op ran: if it has given
    // up since (its buffers may be reused), what was read may be anything.
    if (message && message->borrowed && in->peerClosed())
      failClosed(*lane.info, step.recvPeer, "read the data it lent");
    if (in) in->releaseRecv();
    lane.done += piece;
    moved = true;
  }
  if (lane.done == total) {
    lane.done = 0;
    ++lane.step;
    moved = true;
  }
  return moved;
}

void Executor::failIfRevoked(const OpInfo& info) {
  for (int peer = 0; peer < static_cast<int>(wiring_.connections.size()); ++peer) {
    const transport::Connection* connection = wiring_.connections[peer];
    if (peer != rank_ && connection && connection->peerClosed() && connection->failedRank() >= 0 &&
        connection->peerReason() == transport::GiveUpReason::Revoked)
      failClosed(info, peer, "waited");
  }
}

void Executor::failIfAbandoned(const OpInfo& info) {
  auto gaveUp = [](const transport::Connection& connection) {
    return connection.peerClosed() && connection.failedRank() >= 0;
  };
  for (const Unflushable& each : unflushable_)
    if (!each.connection->flushed() && gaveUp(*each.connection))
      failClosed(info, each.peer, "still had messages for it");
  // A peer that closed its connection in any way will not read on: it
  // would have had to take the lent message before it finished its part.
  for (const Lent& lent : lent_)
    if (!lent.connection->consumed(lent.ticket) && lent.connection->peerClosed())
      failClosed(info, lent.peer, "still lent it memory to read");
}

void Executor::failAborted(const OpInfo& info) {
  if (!revoked_.load(std::memory_order_relaxed))
    fail(ErrorCode::Aborted, rank_,
         format("%s: the communicator was aborted", info.describe().c_str()));
  blamed_ = rank_;  // what the peers are told when this rank gives up
  blamedReason_ = transport::GiveUpReason::Revoked;
  fail(ErrorCode::Revoked, rank_,
       format("%s: this rank revoked the communicator", info.describe().c_str()));
}

void Executor::failClosed(const OpInfo& info, int peer, const char* doing) {
  const int failed = wiring_.connections[peer]->failedRank();
  blamed_ = failed >= 0 ? failed : peer;
  blamedReason_ =
      failed >= 0 ? wiring_.connections[peer]->peerReason() : transport::GiveUpReason::Failed;
  if (failed >= 0 && blamedReason_ == transport::GiveUpReason::Revoked)
    fail(ErrorCode::Revoked, rank_,
         format("%s: rank %d revoked the communicator (peer %d closed its connection saying so) "
                "while this rank %s",
                info.describe().c_str(), failed, peer, doing));
  if (blamedReason_ == transport::GiveUpReason::TimedOut)
    fail(ErrorCode::Timeout, rank_,
         format("%s: rank %d stopped answering: peer %d timed out waiting for it and gave up, "
                "while this rank %s",
                info.describe().c_str(), failed, peer, doing));
  if (failed >= 0 && failed != peer)
    fail(ErrorCode::RemoteError, rank_,
         format("%s: rank %d failed: peer %d gave up on it and closed its connection while this "
                "rank %s",
                info.describe().c_str(), failed, peer, doing));
  fail(ErrorCode::RemoteError, rank_,
       format("%s: peer %d closed its connection while this rank %s (the peer exited, failed or "
              "destroyed its communicator)",
              info.describe().c_str(), peer, doing));
}

bool Executor::progressTransports() {
  bool moved = false;
  for (transport::Transport* transport : active_) moved |= transport->progress();
  return moved;
}

bool Executor::flushed() const {
  for (const Unflushable& each : unflushable_)
    if (!each.connection->flushed()) return false;
  return true;
}

void Executor::prepareToWait() {
  for (transport::Transport* transport : waitable_) transport->prepareToWait();
}

int Executor::cpuSharingPeer() const {
  int lowest = -1;
  for (const transport::Transport* transport : waitable_)
    if (const int peer = transport->cpuSharingPeer(); peer >= 0 && (lowest < 0 || peer < lowest))
      lowest = peer;
  return lowest;
}

int leaveCpu() {
  const int cpu = ::sched_getcpu();
  cpu_set_t allowed, others;
  CPU_ZERO(&allowed);
  if (cpu < 0 || cpu >= CPU_SETSIZE || ::sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
      !CPU_ISSET(cpu, &allowed) || CPU_COUNT(&allowed) < 2)
    return -1;
  others = allowed;
  CPU_CLR(cpu, &others);
  // Narrowing the set moves the thread at once; the set it had comes back
  // right after, and the thread stays where it went.
  if (::sched_setaffinity(0, sizeof others, &others) != 0) return -1;
  ::sched_setaffinity(0, sizeof allowed, &allowed);
  return cpu;
}

bool Executor::leaveSharedCpu(Clock::time_point now, int peer) {
  if (now < nextLeave_) return false;
  nextLeave_ = now + kLeaveInterval;
  const int left = leaveCpu();
  if (left < 0) return false;
  BRAID_DEBUG(Exec, "rank %d ran on CPU %d with rank %d: moved to CPU %d", rank_, left, peer,
              ::sched_getcpu());
  return true;
}

void Executor::waitForActivity(Clock::time_point until) {
  if (waitable_.empty()) {  // nothing to block on (only the loopback): just sleep
    std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), kShortSleep));
    return;
  }
  if (waitable_.size() == 1) {
    waitable_[0]->waitForActivity(until);
    return;
  }
  // Several transports cannot be waited on together: short turns each.
  auto slice = std::min(until, Clock::now() + kShortSleep);
  for (transport::Transport* transport : waitable_) transport->waitForActivity(slice);
}

void Executor::adaptSpin(Clock::duration waited) {
  if (waited < kQuickAnswer) {
    pureSpin_ = std::min(kPureSpin, pureSpin_ + std::chrono::nanoseconds(500));
  } else if (waited > pureSpin_) {
    pureSpin_ /= 2;
  }
}

Executor::Wait Executor::waitOf(const Lane* lanes, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const Lane& lane = lanes[i];
    if (lane.step == lane.plan->steps.size()) continue;
    const algo::Step& step = lane.plan->steps[lane.step];
    const bool receiving = receives(step.kind) && !wiring_.connections[step.recvPeer]->peekRecv();
    return {&lane, receiving ? step.recvPeer : step.sendPeer, receiving};
  }
  if (!allReturned()) return {nullptr, lent_[0].peer, false, true};
  // Every step is done: the wait is for a peer to take the last messages.
  for (const Unflushable& each : unflushable_)
    if (!each.connection->flushed()) return {nullptr, each.peer, false};
  return {};
}

void Executor::announceWaitingFor(int rank) {
  waitingFor_ = rank;
  for (transport::Transport* transport : waitable_) transport->announceWaitingFor(rank);
}

void Executor::followWaits(const Lane* lanes, size_t count) {
  const int peer = waitOf(lanes, count).peer;
  int culprit = peer;
  if (peer >= 0) {
    // A rank that names this one waits in a cycle: keep to the peer.
    const int further = wiring_.connections[peer]->peerWaitsFor();
    if (further >= 0 && further != rank_) culprit = further;
  }
  if (culprit != waitingFor_) announceWaitingFor(culprit);
}

void Executor::failStalled(const Lane* lanes, size_t count, Clock::duration waited,
                           std::chrono::milliseconds timeout) {
  const Wait wait = waitOf(lanes, count);
  const Lane* lane = wait.lane ? wait.lane : lanes;
  std::string where = "flushing its last messages";
  if (!wait.lane && wait.peer >= 0)
    where = wait.lent
                ? format("waiting for rank %d to finish reading this rank's memory", wait.peer)
                : format("waiting for rank %d to take its last messages", wait.peer);
  if (wait.lane) {
    const size_t steps = lane->plan->steps.size();
    where = wait.receiving ? format("at step %zu of %zu, waiting for data from rank %d",
                                    lane->step + 1, steps, wait.peer)
                           : format("at step %zu of %zu, waiting for rank %d to take data",
                                    lane->step + 1, steps, wait.peer);
  }
  blamed_ = wait.peer;
  blamedReason_ =
      wait.peer >= 0 ? transport::GiveUpReason::TimedOut : transport::GiveUpReason::Failed;
  const auto ms =
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
  // (The wait runs a grace past the timeout, for the ranks to tell each
  // other whom they wait for.)
  const std::string limit =
      format(" (the timeout is %lld ms)", static_cast<long long>(timeout.count()));
  if (wait.peer >= 0 && waitingFor_ >= 0 && waitingFor_ != wait.peer) {
    // The peer said it waits for another rank in turn: that one is stuck.
    blamed_ = waitingFor_;
    fail(ErrorCode::Timeout, rank_,
         format("%s timed out after %lld ms: rank %d stopped answering (this rank is %s, and rank "
                "%d waits, directly or through other ranks, for rank %d)%s",
                lane->info->describe().c_str(), ms, waitingFor_, where.c_str(), wait.peer,
                waitingFor_, limit.c_str()));
  }
  fail(ErrorCode::Timeout, rank_,
       format("%s timed out after %lld ms %s%s", lane->info->describe().c_str(), ms, where.c_str(),
              limit.c_str()));
}

int Executor::awaitSender(const OpInfo& info, const std::vector<uint32_t>& tags, uint32_t mask,
                          int first, std::chrono::milliseconds timeout,
                          const std::atomic<bool>& aborted) {
  const int n = static_cast<int>(tags.size());
  blamed_ = -1;
  blamedReason_ = transport::GiveUpReason::Failed;
  activity_.begin(info);
  Clock::time_point start{}, deadline{};
  bool armed = false;
  unsigned turns = 0;
  try {
    for (;;) {
      if (!active_.empty()) progressTransports();
      int open = 0, closed = -1;
      for (int k = 0; k < n; ++k) {
        const int peer = (first + k) % n;
        if (tags[peer] == 0) continue;
        transport::Connection* in = wiring_.connections[peer];
        if (const transport::Message* message = in->peekRecv()) {
          if ((message->tag & mask) == (tags[peer] & mask)) {
            activity_.name.store(nullptr, std::memory_order_relaxed);
            return peer;
          }
          ++open;  // its messages of later ops come after this one
        } else if (in->peerClosed()) {
          // A peer that gave up on a failed rank: the communicator failed.
          if (in->failedRank() >= 0) failClosed(info, peer, "waits for data from any rank");
          closed = peer;  // (it may only have left: the others may still send)
        } else {
          ++open;
        }
      }
      if (open == 0) failClosed(info, closed, "waits for data from any rank");
      if (aborted.load(std::memory_order_relaxed)) failAborted(info);
      if (++turns <= kUncountedTurns) {
        cpuRelax();
        continue;
      }
      const Clock::time_point now = Clock::now();
      if (start == Clock::time_point{}) {
        start = now;
        deadline = now + timeout;
        activity_.describe(info, 1, 1);
        activity_.waitingSince.store(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
            std::memory_order_relaxed);
      }
      if (now >= deadline)
        fail(ErrorCode::Timeout, rank_,
             format("%s timed out after %lld ms waiting for data from any rank (the timeout is "
                    "%lld ms)",
                    info.describe().c_str(),
                    static_cast<long long>(
                        std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()),
                    static_cast<long long>(timeout.count())));
      if (!armed) {  // snapshot, then one more full pass before any sleep
        prepareToWait();
        armed = true;
        continue;
      }
      waitForActivity(std::min(deadline, now + kLongestSleep));
      prepareToWait();
    }
  } catch (const Error& error) {
    if (std::strncmp(error.what(), "braid rank", 10) == 0) throw;
    for (const transport::Transport* transport : active_)
      if (blamed_ < 0) blamed_ = transport->failedPeer();
    fail(error.code(), rank_, info.describe() + ": " + error.what());
  }
}

void Executor::run(Lane* lanes, size_t count, std::chrono::milliseconds timeout,
                   const std::atomic<bool>& aborted) {
  // The clock is read only once the op first has to wait: an op that never
  // waits costs no clock read. Time spent before that counts as progress.
  Clock::time_point deadline{}, waitStart{}, nextRevokeCheck{};
  bool inGrace = false;
  lent_.clear();  // a failed op's leftovers: its peers failed too
  blamed_ = -1;
  blamedReason_ = transport::GiveUpReason::Failed;
  // Each lane's scratch: kScratchBytes, or what its plan asks for. The area
  // only grows, so a repeated op allocates nothing.
  size_t need = 0;
  for (size_t i = 0; i < count; ++i) need += scratchOf(lanes[i], kScratchAlignment);
  if (scratch_.size() < need) scratch_.resize(need);
  for (size_t i = 0, at = 0; i < count; at += scratchOf(lanes[i], kScratchAlignment), ++i)
    lanes[i].scratch = scratch_.data() + at;
  std::unique_ptr<Turns<Lane>> directions;  // whose turn it is on each, in a group
  if (count > 1)
    directions =
        std::make_unique<Turns<Lane>>(lanes, count, static_cast<int>(wiring_.connections.size()));
  // Idle bookkeeping. The clock is first read kUncountedTurns into an idle
  // spell (at once when this rank must not spin) and then every 16th turn,
  // not on every pass.
  Clock::time_point idleSince{}, now{};
  bool idle = false;
  bool counted = false;  // the clock runs for this idle spell
  bool armed = false;    // the transports hold a snapshot to wait against
  unsigned turns = 0;
  activity_.begin(*lanes->info);
  // Where this rank waits, for hang reports: the first lane with steps left.
  auto noteWaiting = [&] {
    for (size_t i = 0; i < count; ++i) {
      const Lane& lane = lanes[i];
      if (lane.step == lane.plan->steps.size()) continue;
      activity_.describe(*lane.info, lane.plan->steps.size(), count);
      const algo::Step& step = lane.plan->steps[lane.step];
      activity_.step.store(lane.step, std::memory_order_relaxed);
      activity_.recvPeer.store(receives(step.kind) ? step.recvPeer : -1, std::memory_order_relaxed);
      activity_.sendPeer.store(sends(step.kind) ? step.sendPeer : -1, std::memory_order_relaxed);
      break;
    }
    activity_.waitingSince.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
        std::memory_order_relaxed);
  };
  auto startIdleClock = [&] {
    idleSince = now = Clock::now();
    if (deadline == Clock::time_point{}) {
      waitStart = now;
      deadline = now + timeout;
    }
    noteWaiting();
  };
  try {
    // A pass over the lanes allocates nothing and takes no lock; on shm it
    // makes no system call either until the op has spun idle (then
    // sched_yield and the transports' sleeps).
    for (;;) {
      // Transports first: a pass starts by taking in what arrived.
      bool moved = !active_.empty() && progressTransports();
      bool finished = true;
      for (size_t i = 0; i < count; ++i) {
        Lane& lane = lanes[i];
        if (lane.step == lane.plan->steps.size()) continue;
        if (!directions || directions->mayRun(i, lane.plan->steps[lane.step]))
          moved |= advance(lane);
        finished &= lane.step == lane.plan->steps.size();
      }
      if (finished) {
        if (flushed() && allReturned()) {
          activity_.name.store(nullptr, std::memory_order_relaxed);
          if (waitingFor_ >= 0) announceWaitingFor(-1);
          return;
        }
        failIfAbandoned(*lanes->info);
      }
      if (aborted.load(std::memory_order_relaxed)) failAborted(*lanes->info);
      if (moved) {
        if (idle) {
          adaptSpin(counted ? now - idleSince : Clock::duration::zero());
          if (counted) activity_.waitingSince.store(0, std::memory_order_relaxed);
        }
        idle = false;
        continue;
      }
      if (!idle) {
        idle = true;
        armed = false;
        turns = 0;
        // A rank that must not spin starts counting at once.
        counted = pureSpin_ == Clock::duration::zero();
        if (counted) startIdleClock();
      }
      ++turns;
      if (!counted) {
        // Most waits on the latency path end within these turns: poll
        // without reading the clock (a clock read costs about as much as a
        // whole small message) and without pausing, to see the answer the
        // moment it lands.
        if (turns <= kUncountedTurns) continue;
        counted = true;
        startIdleClock();
      } else if ((turns & 15) == 0) {
        now = Clock::now();
      }
      if (now >= deadline) {
        // Past the timeout, a short grace first. This rank tells its peers
        // whom it waits for and they tell it whom they wait for, so that
        // every rank of a chain of waits names the rank at its end; and a
        // peer that gave up earlier tells whom it blamed.
        if (!inGrace) {
          inGrace = true;
          deadline = now + std::min<Clock::duration>(timeout / 4, std::chrono::seconds(1));
        } else {
          failStalled(lanes, count, now - waitStart, timeout);
        }
      }
      if (inGrace) followWaits(lanes, count);
      if (now >= nextRevokeCheck) {
        nextRevokeCheck = now + kRevokeCheck;
        failIfRevoked(*lanes->info);
      }
      const auto idleFor = now - idleSince;
      if (idleFor <= pureSpin_) {
        cpuRelax();
      } else if (!armed) {
        // Snapshot, then at least one more full pass before any sleep.
        prepareToWait();
        armed = true;
      } else if (const int sharing = spinFirst_ ? cpuSharingPeer() : -1;
                 sharing >= 0 && idleFor <= kSpin && sharing < rank_ &&
                 leaveSharedCpu(now, sharing)) {
        // On a host with a core per rank, a peer ran on this CPU: the
        // higher rank of the two moves to another and both go on spinning.
        prepareToWait();
      } else if (idleFor > kSpin || sharing >= 0) {
        // Past the spin, or sharing a CPU with a peer (and not moving now):
        // asleep, this rank leaves the CPU to it until it has news.
        waitForActivity(std::min(deadline, now + kLongestSleep));
        prepareToWait();  // the next pass checks every step again before any sleep
        now = Clock::now();
      } else {
        // With more ranks than cores, the peer this rank waits for may be
        // waiting for a core: give it ours.
        sched_yield();
      }
    }
  } catch (const Error& error) {
    // Transports throw without context; name this rank and the op here.
    if (std::strncmp(error.what(), "braid rank", 10) == 0) throw;
    for (const transport::Transport* transport : active_)
      if (blamed_ < 0) blamed_ = transport->failedPeer();
    const Lane* current = lanes;
    for (size_t i = 0; i < count; ++i)
      if (lanes[i].step < lanes[i].plan->steps.size()) current = &lanes[i];
    fail(error.code(), rank_, current->info->describe() + ": " + error.what());
  }
}

}  // namespace braid::exec
