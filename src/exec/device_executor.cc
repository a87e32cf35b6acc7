// The device executor's lowering: plans turned into stream-ordered
// operations (flag waits, copies and reductions, flag writes) on the
// caller's stream, on the issuing thread under mutex_; and the executor's
// life: its making, its end, scratch and events. The watchdog that
// completes and fails the ops is in device_watchdog.cc.
#include "exec/device_executor.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "core/log.h"

namespace braid::exec {
namespace {

using algo::receives;
using algo::sends;
using algo::StepKind;
using device::FlagOp;

static_assert(algo::kMaxDirectRanks <= device::kMaxReduceInputs,
              "a direct reduction combines every rank's buffer in one kernel");

// Each lane's scratch area starts at a multiple of this in the executor's
// device memory, as device allocations do.
constexpr size_t kScratchAlignment = 256;

}  // namespace

DeviceExecutor::DeviceExecutor(device::Device& device,
                               std::unique_ptr<transport::DeviceTransport> transport, int rank,
                               int nranks, int deviceIndex, const std::atomic<int64_t>& timeoutMs,
                               const std::atomic<bool>& aborted, const std::atomic<bool>& revoked,
                               OnFailure onFailure)
    : device_(device),
      transport_(std::move(transport)),
      rank_(rank),
      nranks_(nranks),
      deviceIndex_(deviceIndex),
      timeoutMs_(timeoutMs),
      aborted_(aborted),
      revoked_(revoked),
      onFailure_(std::move(onFailure)),
      slotBytes_(transport_->slotBytes()),
      slots_(static_cast<uint64_t>(transport_->slots())),
      main_{transport_.get(), slotBytes_, slots_, nullptr, nullptr},
      watchdog_([this] { watch(); }) {}

bool DeviceExecutor::hasGraphFifos() {
  std::lock_guard<std::mutex> lock(mutex_);
  return graphTransport_ != nullptr;
}

void DeviceExecutor::setGraphFifos(std::unique_ptr<transport::DeviceTransport> graphs) {
  // Its counters, zeroed: sent, then received, a word per peer. The abort
  // word, which the host writes, is in host memory: a store, never queued
  // behind streams blocked in waits on the device's shared hardware queues.
  const size_t countersBytes = 2 * static_cast<size_t>(nranks_) * sizeof(uint32_t);
  auto* counters = static_cast<uint32_t*>(device_.allocate(deviceIndex_, countersBytes));
  uint32_t* abort = nullptr;
  try {
    abort = static_cast<uint32_t*>(device_.allocateHost(sizeof(uint32_t)));
  } catch (...) {
    device_.free(counters);
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  graphMemoryBytes_ += countersBytes;
  graphTransport_ = std::move(graphs);
  graphs_ = {graphTransport_.get(),
             graphTransport_->slotBytes(),
             static_cast<uint64_t>(graphTransport_->slots()),
             counters,
             counters + nranks_,
             abort};
}

DeviceExecutor::~DeviceExecutor() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Stuck ops fail at their deadline (the watchdog then releases them).
  changed_.wait(lock, [&] { return ops_.empty(); });
  // An aborted communicator's peers must not wait for it: they fail.
  if (revoked_.load(std::memory_order_relaxed))
    transport_->announceFailure(rank_, transport::GiveUpReason::Revoked);
  else if (failure_ || aborted_.load(std::memory_order_relaxed))
    transport_->announceFailure(-1, transport::GiveUpReason::Failed);
  else
    transport_->sayGoodbye();
  // Graph replays may still be queued: after a failure they are released
  // and the memory they use is left mapped (leaked), not pulled from under
  // them.
  if (captured_ && (failure_ || aborted_.load(std::memory_order_relaxed)) && !abandoned_) {
    try {
      releaseGraphWaits();
    } catch (const Error& error) {
      BRAID_WARN(Exec, "device executor: releasing graph replays failed: %s", error.what());
    }
    graphTransport_->keepMemory();
    graphMemory_.clear();
    graphs_.sent = nullptr;
    graphs_.abort = nullptr;  // replays may still read it
  }
  stopping_ = true;
  lock.unlock();
  changed_.notify_all();
  watchdog_.join();
  if (abandoned_) return;  // the device broke: its streams may still use what we hold
  try {
    for (device::EventHandle event : freeEvents_) device_.destroyEvent(event);
    for (std::byte* old : retiredScratch_) device_.free(old);
    if (scratch_) device_.free(scratch_);
    for (std::byte* memory : graphMemory_) device_.free(memory);
    if (graphs_.sent) device_.free(graphs_.sent);
    if (graphs_.abort) device_.free(graphs_.abort);
    if (sends_) device_.destroyStream(sends_);
  } catch (const Error& error) {
    BRAID_WARN(Exec, "device executor: freeing its device resources failed: %s", error.what());
  }
}

void DeviceExecutor::waitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return ops_.empty(); });
}

DeviceExecutor::Memory DeviceExecutor::memory() {
  std::lock_guard<std::mutex> lock(mutex_);
  Memory memory;
  memory.releasable = scratchBytes_ + retiredBytes_;
  memory.persistent = graphMemoryBytes_ + transport_->deviceBytes() +
                      (graphTransport_ ? graphTransport_->deviceBytes() : 0);
  return memory;
}

size_t DeviceExecutor::releaseScratch() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return ops_.empty(); });
  if (abandoned_) return 0;  // a broken device: its streams may still use it
  const size_t released = scratchBytes_;
  for (std::byte* old : retiredScratch_) device_.free(old);
  retiredScratch_.clear();
  retiredBytes_ = 0;
  if (scratch_) device_.free(scratch_);
  scratch_ = nullptr;
  scratchBytes_ = 0;
  return released;
}

void DeviceExecutor::restoreScratch(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > scratchBytes_) growScratch(bytes);
}

void DeviceExecutor::growScratch(size_t bytes) {
  // Ops in flight may still use the old area: it is freed once none is
  // left (by the watchdog), never waited for here.
  std::byte* bigger = static_cast<std::byte*>(device_.allocate(deviceIndex_, bytes));
  if (scratch_) {
    retiredScratch_.push_back(scratch_);
    retiredBytes_ += scratchBytes_;
  }
  scratch_ = bigger;
  scratchBytes_ = bytes;
}

bool DeviceExecutor::reaches(int peer) const {
  return peer >= 0 && peer < nranks_ && transport_->connection(peer) != nullptr;
}

device::EventHandle DeviceExecutor::takeEvent() {
  if (freeEvents_.empty()) return device_.createEvent(deviceIndex_);
  device::EventHandle event = freeEvents_.back();
  freeEvents_.pop_back();
  return event;
}

void DeviceExecutor::ensureScratch(DeviceLane* lanes, size_t count) {
  size_t need = 0;
  for (size_t i = 0; i < count; ++i) need += scratchOf(lanes[i], kScratchAlignment);
  if (need > scratchBytes_) growScratch(need);
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    lanes[i].scratch = scratch_ + at;
    at += scratchOf(lanes[i], kScratchAlignment);
  }
}

void DeviceExecutor::enqueue(DeviceLane* lanes, size_t count, const device::StreamHandle* streams,
                             size_t streamCount, Done done) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_) throw *failure_;
  for (size_t i = 0; i < count; ++i)
    for (const algo::Step& step : lanes[i].plan->steps)
      for (int peer : peersOf(step))
        if (peer >= 0 && !reaches(peer))
          fail(ErrorCode::InvalidUsage, rank_,
               format("%s: device buffers cannot reach rank %d (no device transport serves it)",
                      lanes[i].info.describe().c_str(), peer));
  // Collectives first, in issue order (the same on every rank), then the
  // point-to-point ops, whose order only matters per peer and direction.
  std::stable_partition(lanes, lanes + count,
                        [](const DeviceLane& lane) { return !lane.pointToPoint; });
  ensureScratch(lanes, count);

  const device::StreamHandle stream = streams[0];
  Op op;
  op.info = lanes[0].info;
  // After the previous op, wherever it ran (also on the same handle: a
  // per-thread default stream is one handle for many streams), and after
  // the group's other streams reached this point.
  if (!ops_.empty()) device_.streamWait(stream, ops_.back().end);
  for (size_t s = 1; s < streamCount; ++s) {
    if (streams[s] == stream) continue;
    device::EventHandle join = takeEvent();
    device_.record(join, streams[s]);
    device_.streamWait(stream, join);
    op.joins.push_back(join);
  }
  op.begin = takeEvent();
  op.end = takeEvent();
  try {
    device_.record(op.begin, stream);
    lower(lanes, count, stream, &op);
    device_.record(op.end, stream);
  } catch (const std::exception& error) {
    failEnqueue(std::move(op), stream, error, lock);
  }
  for (size_t s = 1; s < streamCount; ++s)
    if (streams[s] != stream) device_.streamWait(streams[s], op.end);
  op.done = std::move(done);
  ops_.push_back(std::move(op));
  lock.unlock();
  changed_.notify_all();
}

void DeviceExecutor::failEnqueue(Op op, device::StreamHandle stream, const std::exception& error,
                                 std::unique_lock<std::mutex>& lock) {
  // Part of the op may be on the stream, and the counters moved on: the
  // communicator fails, and the watchdog releases what was enqueued.
  const auto* known = dynamic_cast<const Error*>(&error);
  Error failed(known ? known->code() : ErrorCode::Internal,
               format("braid rank %d: %s: enqueueing on the device failed: %s", rank_,
                      op.info.describe().c_str(), error.what()));
  failAll(failed, -1, transport::GiveUpReason::Failed);
  try {
    if (sends_) {  // part of a group's sends may be there: the end waits for them too
      device::EventHandle join = takeEvent();
      op.joins.push_back(join);
      device_.record(join, sends_);
      device_.streamWait(stream, join);
    }
    device_.record(op.end, stream);
    op.done = [](const Error*) {};  // the caller completes the op's Work with the throw
    ops_.push_back(std::move(op));
  } catch (const Error&) {  // the stream cannot even take an event: nothing to track
  }
  lock.unlock();
  changed_.notify_all();
  throw failed;
}

void DeviceExecutor::enqueueOneSided(const OpInfo& info, device::StreamHandle stream, void* dst,
                                     const void* src, size_t bytes,
                                     const std::vector<device::FlagOp>& flags,
                                     std::vector<BoardWait> waits, Done done,
                                     device::EventHandle reached) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_) throw *failure_;
  Op op;
  op.info = info;
  if (!ops_.empty()) device_.streamWait(stream, ops_.back().end);
  op.begin = takeEvent();
  op.end = takeEvent();
  op.boardWaits = std::move(waits);
  try {
    device_.record(op.begin, stream);
    if (reached) device_.record(reached, stream);
    if (bytes > 0) device_.copy(stream, dst, src, bytes);
    std::vector<device::FlagOp> all = flags;
    for (const BoardWait& wait : op.boardWaits)
      all.push_back(device::FlagOp::wait(wait.flag, wait.value));
    if (!all.empty()) device_.flagOps(stream, all.data(), all.size());
    device_.record(op.end, stream);
  } catch (const std::exception& error) {
    failEnqueue(std::move(op), stream, error, lock);
  }
  op.done = std::move(done);
  ops_.push_back(std::move(op));
  lock.unlock();
  changed_.notify_all();
}

void DeviceExecutor::failWith(const Error& error, int blamed) {
  std::unique_lock<std::mutex> lock(mutex_);
  failAll(error, blamed, transport::GiveUpReason::Failed);
  lock.unlock();
  changed_.notify_all();
}

void DeviceExecutor::enqueueCaptured(DeviceLane* lanes, size_t count, device::StreamHandle stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_) throw *failure_;
  const std::string what = lanes[0].info.describe();
  size_t sendsAndReceives = 0;
  bool anySend = false;
  for (size_t i = 0; i < count; ++i) {
    sendsAndReceives += lanes[i].pointToPoint ? 1 : 0;
    for (const algo::Step& step : lanes[i].plan->steps) {
      anySend |= lanes[i].pointToPoint && step.kind == StepKind::Send;
      for (int peer : peersOf(step))
        if (peer >= 0 && !graphs_.transport->connection(peer))
          fail(ErrorCode::InvalidUsage, rank_,
               format("%s: the stream is being captured into a CUDA graph, and rank %d is "
                      "reached by '%s': a graph can hold device ops only between ranks that "
                      "map each other's device memory",
                      lanes[i].info.describe().c_str(), peer, transport_->path(peer).c_str()));
    }
  }
  if (sendsAndReceives > 1 && anySend)
    fail(ErrorCode::InvalidUsage, rank_,
         format("%s: the stream is being captured into a CUDA graph, and a group of several "
                "sends and receives cannot be captured yet (braid runs its sends on a stream "
                "of its own)",
                what.c_str()));
  std::stable_partition(lanes, lanes + count,
                        [](const DeviceLane& lane) { return !lane.pointToPoint; });
  // Scratch apart from the ordinary ops' (replays run whenever a graph is
  // launched), shared by every captured op (replays run one at a time per
  // communicator); an area outgrown stays for the graphs that use it.
  size_t need = 0;
  for (size_t i = 0; i < count; ++i) need += scratchOf(lanes[i], kScratchAlignment);
  if (need > graphScratchBytes_) {
    graphMemory_.push_back(static_cast<std::byte*>(device_.allocate(deviceIndex_, need)));
    graphScratchBytes_ = need;
    graphMemoryBytes_ += need;
  }
  for (size_t i = 0, at = 0; i < count; at += scratchOf(lanes[i], kScratchAlignment), ++i)
    lanes[i].scratch = graphMemory_.back() + at;

  // Message numbers count from 0 within the op; the device counters say
  // where each replay starts.
  for (int peer = 0; peer < nranks_; ++peer)
    if (transport::DeviceConnection* c = graphs_.transport->connection(peer))
      c->send.next = c->recv.next = 0;
  ch_ = &graphs_;
  Op untracked;
  try {
    lower(lanes, count, stream, &untracked);
    // Whole laps of the slots, then the counters move on.
    for (int peer = 0; peer < nranks_; ++peer) {
      transport::DeviceConnection* c = graphs_.transport->connection(peer);
      if (!c) continue;
      while (c->send.next % graphs_.slots) {
        awaitCredit(peer);
        postMessage(peer, lanes[0].tag, 0);
      }
      while (c->recv.next % graphs_.slots) {
        awaitData(peer, lanes[0].tag);
        releaseMessage(peer);
      }
    }
    for (int peer = 0; peer < nranks_; ++peer) {
      const transport::DeviceConnection* c = graphs_.transport->connection(peer);
      if (!c) continue;
      if (c->send.next)
        pendingFlags_.push_back(FlagOp::add(graphs_.sent + peer, low(c->send.next)));
      if (c->recv.next)
        pendingFlags_.push_back(FlagOp::add(graphs_.received + peer, low(c->recv.next)));
    }
    flushFlags();
  } catch (const std::exception& error) {
    // Part of the op may be in the graph, its counters never advanced: the
    // communicator fails (and a replay of that graph is released).
    ch_ = &main_;
    pendingFlags_.clear();
    captured_ = true;
    const auto* known = dynamic_cast<const Error*>(&error);
    Error failed(known ? known->code() : ErrorCode::Internal,
                 format("braid rank %d: %s: capturing into a CUDA graph failed: %s", rank_,
                        what.c_str(), error.what()));
    failAll(failed, -1, transport::GiveUpReason::Failed);
    lock.unlock();
    changed_.notify_all();
    throw failed;
  }
  ch_ = &main_;
  captured_ = true;
}

void DeviceExecutor::lower(DeviceLane* lanes, size_t count, device::StreamHandle stream, Op* op) {
  lowering_ = op;
  pendingFlags_.clear();
  pendingStream_ = stream;
  const size_t collectives = static_cast<size_t>(
      std::find_if(lanes, lanes + count, [](const DeviceLane& l) { return l.pointToPoint; }) -
      lanes);
  // The collectives go one after another, each whole before the next, as
  // if issued alone. On one stream interleaving their pieces gains little,
  // and it can deadlock: where one rank must hold back a piece (its step
  // also uses a direction another lane holds) and its peer need not, their
  // k-th messages on a connection fall in different rounds, and two
  // streams can each wait for a message the other lowered after its wait.
  for (size_t i = 0; i < collectives; ++i) lowerInTurns(lanes + i, 1, stream, nullptr);
  const bool sendsApart =
      count - collectives > 1 && std::any_of(lanes + collectives, lanes + count, [](auto& l) {
        return !l.plan->steps.empty() && l.plan->steps[0].kind == StepKind::Send;
      });
  if (!sendsApart) {
    lowerInTurns(lanes + collectives, count - collectives, stream, nullptr);
  } else {
    // The sends fork from the caller's stream after the collectives and
    // join it before the op's end.
    device::StreamHandle sends = sendStream();
    device::EventHandle fork = takeEvent(), join = takeEvent();
    op->joins.push_back(fork);
    op->joins.push_back(join);
    flushFlags();
    device_.record(fork, stream);
    device_.streamWait(sends, fork);
    lowerInTurns(lanes + collectives, count - collectives, stream, sends);
    flushFlags();
    device_.record(join, sends);
    device_.streamWait(stream, join);
  }
  flushFlags();
  // Where every connection the op used must get to.
  for (size_t i = 0; i < count; ++i)
    for (const algo::Step& step : lanes[i].plan->steps)
      for (int peer : peersOf(step)) {
        if (peer < 0) continue;
        const bool known = std::any_of(op->targets.begin(), op->targets.end(),
                                       [&](const Op::Target& t) { return t.peer == peer; });
        if (known) continue;
        const transport::DeviceConnection* c = ch_->transport->connection(peer);
        op->targets.push_back({peer, c->recv.next, c->send.next});
      }
}

void DeviceExecutor::lowerInTurns(DeviceLane* lanes, size_t count, device::StreamHandle stream,
                                  device::StreamHandle sendsOn) {
  if (count == 0) return;
  auto streamOf = [&](const DeviceLane& lane) {
    return sendsOn && lane.plan->steps[lane.step].kind == StepKind::Send ? sendsOn : stream;
  };
  if (count == 1) {
    DeviceLane& lane = lanes[0];
    while (lane.step < lane.plan->steps.size()) lowerPiece(lane, streamOf(lane));
    return;
  }
  // In rounds: one piece of every lane whose turn it is (the host
  // executor's rule, decided here while lowering instead of while running),
  // until all are done.
  Turns<DeviceLane> turns(lanes, count, nranks_);
  for (bool left = true; left;) {
    left = false;
    turns.nextRound();
    for (size_t i = 0; i < count; ++i) {
      DeviceLane& lane = lanes[i];
      if (lane.step == lane.plan->steps.size()) continue;
      left = true;
      const algo::Step& step = lane.plan->steps[lane.step];
      if (!turns.mayRunThisRound(i, step)) continue;
      turns.ran(step);  // (before lowering: lowerPiece may move to the next step)
      lowerPiece(lane, streamOf(lane));
    }
  }
}

device::StreamHandle DeviceExecutor::sendStream() {
  if (!sends_) sends_ = device_.createStream(deviceIndex_);
  return sends_;
}

void DeviceExecutor::flushFlags() {
  if (pendingFlags_.empty()) return;
  if (ch_->abort)  // a replay's waits end when the communicator fails
    for (FlagOp& op : pendingFlags_)
      if (op.kind == FlagOp::Kind::Wait) op.abort = ch_->abort;
  device_.flagOps(pendingStream_, pendingFlags_.data(), pendingFlags_.size());
  pendingFlags_.clear();
  // The stream may run what is enqueued at once, before the op is whole: a
  // proxy learns now what is coming.
  if (ch_ == &main_) transport_->enqueued();
}

void DeviceExecutor::lowerPiece(DeviceLane& lane, device::StreamHandle stream) {
  if (stream != pendingStream_) {
    flushFlags();
    pendingStream_ = stream;
  }
  const algo::Step& step = lane.plan->steps[lane.step];
  if (step.kind == StepKind::Signal) return lowerSignals(lane);
  if (algo::direct(step.kind)) return lowerDirect(lane, stream);
  const size_t elemSize = dataTypeSize(lane.type);
  const size_t total = step.count * elemSize;
  const bool reads = readsSrc(step.kind), writes = writesDst(step.kind);
  std::byte* src = reads ? bufferOf(lane, step.src) + step.srcOffset * elemSize : nullptr;
  std::byte* dst = writes ? bufferOf(lane, step.dst) + step.dstOffset * elemSize : nullptr;
  const int divisor = step.finalize && lane.op == ReduceOp::Avg ? lane.nranks : 0;

  auto reduceArgs = [&](void* out, const void* a, const void* b, size_t elems, int finalize) {
    device::ReduceArgs args;
    args.dst = out;
    args.srcs[0] = a;
    args.srcs[1] = b;
    args.inputs = b ? 2 : 1;
    args.count = elems;
    args.type = lane.type;
    args.op = lane.op;
    args.finalizeDivisor = finalize;
    return args;
  };

  if (step.kind == StepKind::Copy || step.kind == StepKind::Reduce) {
    flushFlags();
    if (step.kind == StepKind::Reduce)
      device_.reduce(stream, reduceArgs(dst, dst, src, step.count, divisor));
    else if (divisor)
      device_.reduce(stream, reduceArgs(dst, src, nullptr, step.count, divisor));
    else if (src != dst)
      device_.copy(stream, dst, src, total);
    ++lane.step;
    return;
  }

  transport::DeviceFifo* in =
      receives(step.kind) ? &ch_->transport->connection(step.recvPeer)->recv : nullptr;
  transport::DeviceFifo* out =
      sends(step.kind) ? &ch_->transport->connection(step.sendPeer)->send : nullptr;
  const size_t piece = std::min(ch_->slotBytes, total - lane.done);
  const size_t elems = piece / elemSize;
  const std::byte* mine = reads ? src + lane.done : nullptr;
  std::byte* result = writes ? dst + lane.done : nullptr;
  std::byte* inSlot = nullptr;
  std::byte* outSlot = nullptr;
  // The data has arrived; the peer's slot is free again.
  if (in) {
    inSlot = in->slots + (in->next % ch_->slots) * ch_->slotBytes;
    awaitData(step.recvPeer, lane.tag);
    noteReceived(step.recvPeer, in->next, lane.tag);
  }
  if (out) {
    outSlot = out->slots + (out->next % ch_->slots) * ch_->slotBytes;
    awaitCredit(step.sendPeer);
  }
  flushFlags();
  switch (step.kind) {
    case StepKind::Send:
      device_.copy(stream, outSlot, mine, piece);
      break;
    case StepKind::Recv:
      device_.copy(stream, result, inSlot, piece);
      break;
    case StepKind::RecvReduceSend:  // fused: reduced straight into the peer's slot
      device_.reduce(stream, reduceArgs(outSlot, inSlot, mine, elems, 0));
      break;
    case StepKind::RecvReduceCopy:
      device_.reduce(stream, reduceArgs(result, inSlot, mine, elems, divisor));
      break;
    case StepKind::RecvReduceCopySend:
      device_.reduce(stream, reduceArgs(result, inSlot, mine, elems, divisor));
      device_.copy(stream, outSlot, result, piece);
      break;
    case StepKind::RecvCopySend:
      device_.copy(stream, result, inSlot, piece);
      device_.copy(stream, outSlot, inSlot, piece);
      break;
    case StepKind::Copy:
    case StepKind::Reduce:
    case StepKind::Signal:  // (lowered apart)
    case StepKind::ReduceFrom:
    case StepKind::CopyTo:
    case StepKind::CopyFrom:
      break;
  }
  // Tell the peer its slot is filled, and the sender its slot is free;
  // flushed together with the next piece's waits.
  if (out) postMessage(step.sendPeer, lane.tag, piece);
  if (in) releaseMessage(step.recvPeer);
  lane.done += piece;
  if (lane.done == total) {
    lane.done = 0;
    ++lane.step;
  }
}

void DeviceExecutor::postMessage(int peer, uint32_t tag, size_t bytes) {
  transport::DeviceFifo& out = ch_->transport->connection(peer)->send;
  const uint64_t slot = out.next % ch_->slots;
  if (out.lengths)
    pendingFlags_.push_back(FlagOp::write(out.lengths + slot, static_cast<uint32_t>(bytes)));
  pendingFlags_.push_back(FlagOp::write(out.tags + slot, tag));
  pendingFlags_.push_back(FlagOp::write(out.filled, low(++out.next), sent(peer)));
}

void DeviceExecutor::awaitData(int peer, uint32_t tag) {
  const transport::DeviceFifo& in = ch_->transport->connection(peer)->recv;
  pendingFlags_.push_back(
      FlagOp::wait(in.filled, low(in.next + 1), device::Compare::GreaterOrEqual, received(peer)));
  if (!ch_->received)  // (see enqueueCaptured: no tags in graphs)
    pendingFlags_.push_back(
        FlagOp::wait(in.tags + in.next % ch_->slots, tag, device::Compare::Equal));
  lowering_->waits.push_back({peer, true, tag, in.next});
}

void DeviceExecutor::awaitCredit(int peer) {
  const transport::DeviceFifo& out = ch_->transport->connection(peer)->send;
  pendingFlags_.push_back(FlagOp::wait(out.credit, low(out.next + 1 - ch_->slots),
                                       device::Compare::GreaterOrEqual, sent(peer)));
  lowering_->waits.push_back({peer, false, 0, out.next});
}

void DeviceExecutor::noteReceived(int peer, uint64_t message, uint32_t tag) {
  std::vector<Op::Received>& runs = lowering_->received;
  if (!runs.empty() && runs.back().peer == peer && runs.back().tag == tag &&
      runs.back().last == message)
    ++runs.back().last;
  else
    runs.push_back({peer, message, message + 1, tag});
}

void DeviceExecutor::releaseMessage(int peer) {
  transport::DeviceFifo& in = ch_->transport->connection(peer)->recv;
  pendingFlags_.push_back(FlagOp::write(in.credit, low(++in.next), received(peer)));
}

void DeviceExecutor::lowerSignals(DeviceLane& lane) {
  const auto& steps = lane.plan->steps;
  size_t end = lane.step + 1;
  while (end < steps.size() && steps[end].kind == StepKind::Signal) ++end;
  // Every message first (a slot of its own, empty, tagged), then every
  // wait for the peers' and the credit back; merged with what is pending.
  for (size_t s = lane.step; s < end; ++s) {
    awaitCredit(steps[s].sendPeer);
    postMessage(steps[s].sendPeer, lane.tag, 0);
  }
  for (size_t s = lane.step; s < end; ++s) {
    const int peer = steps[s].recvPeer;
    awaitData(peer, lane.tag);
    noteReceived(peer, ch_->transport->connection(peer)->recv.next, lane.tag);
    releaseMessage(peer);
  }
  lane.step = end;
}

void DeviceExecutor::lowerDirect(DeviceLane& lane, device::StreamHandle stream) {
  const algo::Step& step = lane.plan->steps[lane.step];
  const size_t elemSize = dataTypeSize(lane.type);
  auto ofRank = [&](algo::Buffer buffer, int rank) -> std::byte* {
    if (rank == rank_ || buffer == algo::Buffer::Scratch) return bufferOf(lane, buffer);
    return buffer == algo::Buffer::Input
               ? const_cast<std::byte*>(lane.peerInputs[static_cast<size_t>(rank)])
               : lane.peerOutputs[static_cast<size_t>(rank)];
  };
  flushFlags();  // the kernel runs after the waits gathered so far
  switch (step.kind) {
    case StepKind::ReduceFrom: {
      device::ReduceArgs args;
      args.dst = bufferOf(lane, step.dst) + step.dstOffset * elemSize;
      for (int r = 0; r < nranks_; ++r)
        args.srcs[r] = ofRank(step.src, r) + step.srcOffset * elemSize;
      args.inputs = nranks_;
      args.count = step.count;
      args.type = lane.type;
      args.op = lane.op;
      args.finalizeDivisor = step.finalize && lane.op == ReduceOp::Avg ? lane.nranks : 0;
      device_.reduce(stream, args);
      break;
    }
    case StepKind::CopyTo:
      device_.copy(stream, ofRank(step.dst, step.sendPeer) + step.dstOffset * elemSize,
                   bufferOf(lane, step.src) + step.srcOffset * elemSize, step.count * elemSize);
      break;
    case StepKind::CopyFrom:
      device_.copy(stream, bufferOf(lane, step.dst) + step.dstOffset * elemSize,
                   ofRank(step.src, step.recvPeer) + step.srcOffset * elemSize,
                   step.count * elemSize);
      break;
    default:
      break;
  }
  ++lane.step;
}

}  // namespace braid::exec
