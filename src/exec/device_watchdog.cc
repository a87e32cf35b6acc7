// The device executor's watchdog: DeviceExecutor's members that run on a
// thread of their own. It completes each op's Work once the stream has
// passed the op, and fails ops: when a peer gives up (it failed, was aborted
// or timed out), when the connection to a peer breaks, when a peer leaves
// while the op still waits for it, when the communicator is aborted, when a
// device call fails, or when the op runs past the timeout after the stream
// reached it (after a grace in which the ranks tell each other whom they
// wait for, so that the error names the rank at the end of the chain).
//
// What it owns: the thread, the side channel's notices, the peers that left
// (departed_), what this rank last told its peers it waits for
// (waitingFor_), and the end of every op in ops_: it alone pops ops, runs
// their Done (in issue order, each exactly once), recycles their events and
// frees outgrown scratch areas once no op is outstanding.
//
// Locks: it holds mutex_ throughout, its device calls (event queries, flag
// reads and writes from the host) included, and lets it go only while it
// waits for work, while it sleeps between looks at a running op, and while
// an op's Done runs (a Done completes Works under their own locks; their
// waiters may enqueue at once). failAll() runs with mutex_ held, from here
// or from a failed enqueue, and calls OnFailure under it.
//
// What it guarantees (docs/device-memory.md, "Faults"): a wait can never outlive its
// op. Once the executor failed, every turn writes from the host this rank's
// counters, at the furthest value anything enqueued waits for, and the tags
// the oldest outstanding op's receives expect, until the stream has passed
// every op; a captured graph's waits are released for good by its abort
// word. So no stream stays blocked, the failure is sticky, and every Work
// completes with it. If device calls keep failing (a broken device), the
// ops are completed with the failure without the device, whose memory is
// then never freed.
#include <algorithm>
#include <thread>

#include "core/errors.h"
#include "core/log.h"
#include "exec/device_executor.h"

namespace braid::exec {
namespace {

// How often the watchdog looks at a running op, and how long it sleeps
// with nothing outstanding before it looks at the side channel anyway.
constexpr auto kWatchTurn = std::chrono::microseconds(200);
constexpr auto kIdleTurn = std::chrono::milliseconds(20);

}  // namespace

void DeviceExecutor::releaseWaits() {
  // Every counter this rank's streams wait on, at the furthest value
  // anything enqueued waits for.
  for (int peer = 0; peer < nranks_; ++peer) {
    transport::DeviceConnection* c = transport_->connection(peer);
    if (!c) continue;
    device_.writeFlagNow(c->recv.filled, low(c->recv.next));
    device_.writeFlagNow(c->send.credit, low(c->send.next));
  }
  // And the tags its next messages must carry: the stream is in the first
  // op it has not passed, at a message of one of that op's runs. (Which
  // one cannot be read back once both ends released the credit word they
  // share, so each turn writes the runs in another order: the stuck run's
  // tags are written last in some turn.)
  if (ops_.empty()) return;
  const std::vector<Op::Received>& runs = ops_.front().received;
  for (size_t j = 0; j < runs.size(); ++j) {
    const Op::Received& run = runs[(j + releaseTurn_) % runs.size()];
    transport::DeviceConnection* c = transport_->connection(run.peer);
    for (uint64_t m = run.first; m < run.last && m < run.first + slots_; ++m)
      device_.writeFlagNow(c->recv.tags + m % slots_, run.tag);
  }
  ++releaseTurn_;
  // One-sided work's signal waits: their own counters, at their values.
  // (Not the waits for a staged call to be sent: the proxy alone releases
  // those, once it no longer reads the call's source.)
  for (const Op& op : ops_)
    for (const BoardWait& wait : op.boardWaits)
      if (wait.signal >= 0) device_.writeFlagNow(wait.flag, wait.value);
}

void DeviceExecutor::releaseGraphWaits() { device_.writeFlagNow(graphs_.abort, 1); }

Error DeviceExecutor::peerError(const transport::PeerNotice& notice) const {
  const std::string op =
      ops_.empty() ? std::string("device ops") : ops_.front().info.describe() + " on the device";
  const bool timedOut = notice.reason == transport::GiveUpReason::TimedOut;
  if (notice.failedRank >= 0 && notice.reason == transport::GiveUpReason::Revoked)
    return Error(ErrorCode::Revoked,
                 format("braid rank %d: %s: rank %d revoked the communicator (peer %d said so)",
                        rank_, op.c_str(), notice.failedRank, notice.peer));
  if (notice.failedRank == rank_)
    return Error(timedOut ? ErrorCode::Timeout : ErrorCode::RemoteError,
                 format("braid rank %d: %s: peer %d gave up %s this rank", rank_, op.c_str(),
                        notice.peer, timedOut ? "timed out waiting for" : "blaming"));
  if (notice.failedRank >= 0 && timedOut)
    return Error(ErrorCode::Timeout,
                 format("braid rank %d: %s: rank %d stopped answering: peer %d timed out waiting "
                        "for it and gave up",
                        rank_, op.c_str(), notice.failedRank, notice.peer));
  if (notice.failedRank >= 0 && notice.failedRank != notice.peer)
    return Error(ErrorCode::RemoteError,
                 format("braid rank %d: %s: rank %d failed: peer %d gave up on it", rank_,
                        op.c_str(), notice.failedRank, notice.peer));
  return Error(ErrorCode::RemoteError,
               format("braid rank %d: %s: peer %d gave up (it failed or was aborted)", rank_,
                      op.c_str(), notice.peer));
}

// Where `head`'s stream is stuck: its first wait that does not hold, in the
// order they were lowered (a peer that is itself stuck may owe data too,
// yet that is not what holds this rank). Waits for this rank's own
// messages (a send to itself, on another stream) count only with
// `ownWaits`: a rank cannot time out waiting for itself.
DeviceExecutor::Stuck DeviceExecutor::stuckAt(const Op& head, bool ownWaits) {
  Stuck stuck;
  for (const BoardWait& wait : head.boardWaits) {
    const uint32_t raised = device_.readFlagNow(wait.flag);
    if (device::passes(raised, wait.value, device::Compare::GreaterOrEqual)) continue;
    stuck.peer = wait.peer;
    stuck.where =
        wait.signal < 0
            ? format(
                  "waiting to send a put or signal to rank %d through the network (%d calls "
                  "before it)",
                  wait.peer, static_cast<int32_t>(wait.value - raised) - 1)
            : format("waiting for signal %d from rank %d (%d more raises to come)", wait.signal,
                     wait.peer, static_cast<int32_t>(wait.value - raised));
    return stuck;
  }
  for (const Op::Wait& wait : head.waits) {
    const transport::DeviceConnection* c = transport_->connection(wait.peer);
    if (wait.peer == rank_ && !ownWaits) continue;
    if (!wait.data) {
      const auto unread =
          static_cast<int32_t>(low(wait.message) - device_.readFlagNow(c->send.credit));
      if (unread < static_cast<int32_t>(slots_)) continue;
      stuck.peer = wait.peer;
      stuck.where = format("waiting for rank %d to take data (message %llu)", wait.peer,
                           static_cast<unsigned long long>(wait.message));
      return stuck;
    }
    // Taken already (the stream is past it), or here and of its op.
    const uint32_t consumed = device_.readFlagNow(c->recv.credit);
    if (static_cast<int32_t>(consumed - low(wait.message)) > 0) continue;
    const uint32_t filled = device_.readFlagNow(c->recv.filled);
    if (static_cast<int32_t>(filled - low(wait.message)) <= 0) {
      stuck.peer = wait.peer;
      uint64_t last = wait.message + 1;  // the op's last message from the peer
      for (const Op::Target& target : head.targets)
        if (target.peer == wait.peer) last = target.received;
      stuck.where = format("waiting for data from rank %d (%d messages still to come)", wait.peer,
                           static_cast<int32_t>(low(last) - filled));
      return stuck;
    }
    const uint32_t tag = device_.readFlagNow(c->recv.tags + wait.message % slots_);
    if (tag == wait.tag) continue;
    stuck.peer = wait.peer;
    stuck.foreignTag = tag;
    stuck.where =
        format("holding a message of another operation from rank %d (tag %08x)", wait.peer, tag);
    return stuck;
  }
  return stuck;
}

std::string DeviceExecutor::describeStuck() {
  // The watchdog may hold the lock while a device call waits out its
  // deadline: a report does not wait longer than that for it.
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  for (int tries = 0; !lock.try_lock(); ++tries) {
    if (tries == 200) return "on the device: its executor is busy (no answer within 2 s)";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (ops_.empty()) return "";
  const Op& head = ops_.front();
  std::string text = format("on the device: %zu op(s) enqueued and not passed; the oldest, %s, ",
                            ops_.size(), head.info.describe().c_str());
  try {
    if (!device_.query(head.begin))
      return text + "not reached yet: its stream is behind earlier work of its own";
    text += "reached";
    if (head.startedAt)
      text += format(" %.3g s ago",
                     std::chrono::duration<double>(Clock::now() - *head.startedAt).count());
    const Stuck stuck = stuckAt(head, /*ownWaits=*/true);
    return text + ", " +
           (stuck.peer < 0 ? std::string("with every wait's value written: its stream is held by "
                                         "something else (a kernel, or a stream ahead of it on "
                                         "a shared hardware queue)")
                           : stuck.where);
  } catch (const std::exception& error) {
    return text + "its counters could not be read: " + error.what();
  }
}

std::optional<Error> DeviceExecutor::checkDeadline(Op& head, int* blamed) {
  const Clock::time_point now = Clock::now();
  if (!head.startedAt) {
    if (!device_.query(head.begin)) return std::nullopt;  // still behind earlier work
    head.startedAt = now;
  }
  if (now - *head.startedAt < timeout()) return std::nullopt;
  // Whom the stream waits for.
  const Stuck stuck = stuckAt(head, /*ownWaits=*/false);
  if (stuck.foreignTag) {
    // Nothing missing, yet stuck: the peer's next message belongs to
    // another op (the ranks did not issue the same operations).
    if (!head.graceUntil) head.graceUntil = now;  // no peer to hear from: fail now
    *blamed = stuck.peer;
    return Error(ErrorCode::Internal,
                 format("braid rank %d: %s on the device: peer %d sent a message of another "
                        "operation (tag %08x): the ranks did not issue the same operations, or "
                        "grouped them differently",
                        rank_, head.info.describe().c_str(), stuck.peer, *stuck.foreignTag));
  }
  const int peer = stuck.peer;
  const std::string& where = stuck.where;
  int culprit = peer;
  if (peer >= 0) {
    const int further = transport_->peerWaitsFor(peer);
    if (further >= 0 && further != rank_) culprit = further;
  }
  if (culprit != waitingFor_) {
    transport_->announceWaitingFor(culprit);
    waitingFor_ = culprit;
  }
  if (!head.graceUntil)
    head.graceUntil = now + std::min<Clock::duration>(timeout() / 4, std::chrono::seconds(1));
  if (now < *head.graceUntil) return std::nullopt;
  *blamed = culprit;
  const auto ms = static_cast<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - *head.startedAt).count());
  if (culprit != peer)
    return Error(
        ErrorCode::Timeout,
        format("braid rank %d: %s timed out on the device after %lld ms: rank %d stopped "
               "answering (this rank is %s, and rank %d waits, directly or through other "
               "ranks, for rank %d)",
               rank_, head.info.describe().c_str(), ms, culprit, where.c_str(), peer, culprit));
  return Error(ErrorCode::Timeout, format("braid rank %d: %s timed out on the device after %lld "
                                          "ms %s",
                                          rank_, head.info.describe().c_str(), ms, where.c_str()));
}

std::optional<Error> DeviceExecutor::checkDeparted(const Op& head, int* blamed) {
  for (const auto& [peer, goodbye] : departed_)
    for (const BoardWait& wait : head.boardWaits) {
      // (A wait to send is the proxy's to fail; a staged source's raises
      // may still be in its connection.)
      if (wait.peer != peer || wait.signal < 0 || (wait.drained && !wait.drained->load()) ||
          device::passes(device_.readFlagNow(wait.flag), wait.value,
                         device::Compare::GreaterOrEqual))
        continue;
      *blamed = peer;
      return Error(ErrorCode::RemoteError,
                   format("braid rank %d: %s on the device: peer %d %s while this rank waits "
                          "%s",
                          rank_, head.info.describe().c_str(), peer,
                          goodbye ? "destroyed its communicator"
                                  : "closed its connection (it exited or died)",
                          wait.signal < 0 ? "to send to it"
                                          : format("for its signal %d", wait.signal).c_str()));
    }
  for (const auto& [peer, goodbye] : departed_)
    for (const Op::Target& target : head.targets) {
      if (target.peer != peer) continue;
      const transport::DeviceConnection* c = transport_->connection(peer);
      const auto missing =
          static_cast<int32_t>(low(target.received) - device_.readFlagNow(c->recv.filled));
      const auto unread =
          static_cast<int32_t>(low(target.sent) - device_.readFlagNow(c->send.credit));
      if (missing <= 0 && unread <= static_cast<int32_t>(slots_)) continue;
      *blamed = peer;
      if (goodbye)
        return Error(ErrorCode::RemoteError,
                     format("braid rank %d: %s on the device: peer %d destroyed its communicator "
                            "while this op still waits for it (the ranks did not issue the same "
                            "operations)",
                            rank_, head.info.describe().c_str(), peer));
      return Error(ErrorCode::RemoteError,
                   format("braid rank %d: %s on the device: peer %d closed its connection while "
                          "this op still waits for it (the peer exited or died)",
                          rank_, head.info.describe().c_str(), peer));
    }
  return std::nullopt;
}

void DeviceExecutor::failAll(const Error& error, int blamed, transport::GiveUpReason reason) {
  if (failure_) return;
  failure_ = error;
  BRAID_WARN(Exec, "%s", error.what());
  // Peers hear it before this rank's streams move again (see watch()).
  transport_->announceFailure(blamed, reason);
  onFailure_(error, blamed, reason);
}

void DeviceExecutor::watch() {
  // Queries and host-side flag writes act on the communicator's device
  // (else CUDA would set up a context on device 0 for this thread).
  try {
    device_.setCurrent(deviceIndex_);
  } catch (const Error& error) {
    BRAID_WARN(Exec, "device executor: %s", error.what());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    try {
      if (!watchTurn(lock)) return;
      brokenTurns_ = 0;
    } catch (const Error& error) {
      // A device call failed (a broken device or stream): the communicator
      // fails; ops the device cannot report on any more fail with it.
      if (!lock.owns_lock()) lock.lock();
      failAll(
          Error(error.code(), format("braid rank %d: the device failed: %s", rank_, error.what())),
          -1, transport::GiveUpReason::Failed);
      if (++brokenTurns_ > 3) abandonOps(lock);
      std::this_thread::sleep_for(kIdleTurn);
    }
  }
}

void DeviceExecutor::abandonOps(std::unique_lock<std::mutex>& lock) {
  abandoned_ = true;
  transport_->keepMemory();
  if (graphTransport_) graphTransport_->keepMemory();
  while (!ops_.empty()) {
    Op op = std::move(ops_.front());
    ops_.pop_front();
    const Error error = *failure_;
    lock.unlock();
    op.done(&error);
    lock.lock();
  }
  changed_.notify_all();
}

bool DeviceExecutor::watchTurn(std::unique_lock<std::mutex>& lock) {
  if (ops_.empty()) {
    if (stopping_) return false;
    changed_.wait_for(lock, kIdleTurn);
    if (stopping_ && ops_.empty()) return false;
  }
  // Which ops the stream has passed, before looking at the side channel:
  // a peer that gives up says so before its streams write anything more,
  // so an op seen finished here that used such writes is failed below.
  size_t passed = 0;
  while (passed < ops_.size() && device_.query(ops_[passed].end)) ++passed;
  notices_.clear();
  transport_->poll(&notices_);
  // A peer that gave up fails everything here at once. One that left
  // otherwise (cleanly, or exited, or died) wrote all it ever will: only
  // an op still missing some of that fails (checkDeparted).
  for (const transport::PeerNotice& notice : notices_) {
    if (notice.gaveUp)
      failAll(peerError(notice), notice.failedRank >= 0 ? notice.failedRank : notice.peer,
              notice.reason);
    else if (const std::string broke = notice.closed ? transport_->whyBroken(notice.peer) : "";
             !broke.empty())
      failAll(
          Error(ErrorCode::RemoteError,
                format("braid rank %d: %s on the device: the connection to peer %d broke: %s",
                       rank_, ops_.empty() ? "device ops" : ops_.front().info.describe().c_str(),
                       notice.peer, broke.c_str())),
          notice.peer, transport::GiveUpReason::Failed);
    else if (notice.closed)
      departed_.push_back({notice.peer, notice.goodbye});
    // A graph may replay any time: a peer that died fails the communicator
    // now, so that the replays' waits are released.
    if (captured_ && notice.closed && !notice.gaveUp && !notice.goodbye && !failure_)
      failAll(Error(ErrorCode::RemoteError,
                    format("braid rank %d: device ops: peer %d closed its connection (it exited "
                           "or died) while ops of this communicator are captured in CUDA graphs",
                           rank_, notice.peer)),
              notice.peer, transport::GiveUpReason::Failed);
  }
  if (!failure_ && aborted_.load(std::memory_order_relaxed)) {
    // A revoke is told to the peers as one, naming this rank.
    const bool revoked = revoked_.load(std::memory_order_relaxed);
    failAll(Error(revoked ? ErrorCode::Revoked : ErrorCode::Aborted,
                  format("braid rank %d: %s: %s", rank_,
                         ops_.empty() ? "device ops" : ops_.front().info.describe().c_str(),
                         revoked ? "this rank revoked the communicator"
                                 : "the communicator was aborted")),
            revoked ? rank_ : -1,
            revoked ? transport::GiveUpReason::Revoked : transport::GiveUpReason::Failed);
  }
  if (!failure_ && passed < ops_.size()) {
    int blamed = -1;
    if (std::optional<Error> late = checkDeadline(ops_[passed], &blamed))
      failAll(*late, blamed,
              blamed >= 0 && late->code() == ErrorCode::Timeout ? transport::GiveUpReason::TimedOut
                                                                : transport::GiveUpReason::Failed);
    else if (std::optional<Error> orphaned = checkDeparted(ops_[passed], &blamed))
      failAll(*orphaned, blamed, transport::GiveUpReason::Failed);
  }
  if (failure_) {
    // Every op fails, those the stream passed meanwhile too; the waits
    // are released until the stream has passed them all (and a graph's
    // for as long as the communicator lives: replays come unannounced).
    releaseWaits();
    if (captured_ && !abandoned_ && !graphsReleased_) {
      releaseGraphWaits();
      graphsReleased_ = true;
    }
    passed = 0;
    while (passed < ops_.size() && device_.query(ops_[passed].end)) ++passed;
  }
  const std::optional<Error> error = failure_;
  for (size_t i = 0; i < passed; ++i) {
    Op op = std::move(ops_.front());
    ops_.pop_front();
    freeEvents_.push_back(op.begin);
    freeEvents_.push_back(op.end);
    for (device::EventHandle join : op.joins) freeEvents_.push_back(join);
    lock.unlock();
    op.done(error ? &*error : nullptr);
    lock.lock();
  }
  if (ops_.empty() && !abandoned_) {
    for (std::byte* old : retiredScratch_) device_.free(old);
    retiredScratch_.clear();
    retiredBytes_ = 0;
  }
  if (passed > 0) {
    changed_.notify_all();
    if (waitingFor_ >= 0 && !failure_) {  // the late op finished after all
      transport_->announceWaitingFor(-1);
      waitingFor_ = -1;
    }
  }
  if (!ops_.empty()) {
    lock.unlock();
    std::this_thread::sleep_for(kWatchTurn);
    lock.lock();
  }
  return true;
}

}  // namespace braid::exec
