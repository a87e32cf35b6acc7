// The op pipeline: issue -> plan -> executor. An op is issued into the
// open group, onto the progress thread or inline; its plan comes from the
// cache (timing contenders on a first call under measured tuning); the
// host executor runs host buffers, the device executor enqueues device
// buffers on their stream.
#include <algorithm>
#include <cstring>

#include "core/communicator_impl.h"
#include "core/diagnose.h"
#include "core/errors.h"
#include "core/log.h"
#include "tuning/algo_choice.h"

namespace braid {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

namespace {

// The bytes an op reads and writes, by NCCL's buffer conventions.
struct Extents {
  const std::byte* in;
  size_t inBytes;
  const std::byte* out;
  size_t outBytes;
};

Extents extentsOf(const PendingOp& op, int nranks) {
  size_t inBytes = op.info.count * dataTypeSize(op.info.type), outBytes = inBytes;
  if (op.kind == Collective::AllGather) outBytes *= static_cast<size_t>(nranks);
  if (op.kind == Collective::ReduceScatter) inBytes *= static_cast<size_t>(nranks);
  return {static_cast<const std::byte*>(op.input), op.input ? inBytes : 0,
          static_cast<const std::byte*>(op.output), op.output ? outBytes : 0};
}

bool overlap(const std::byte* a, size_t aBytes, const std::byte* b, size_t bBytes) {
  return aBytes && bBytes && a < b + bBytes && b < a + aBytes;
}

}  // namespace

void Communicator::Impl::findRegions(const PendingOp* ops, exec::Lane* lanes, size_t count) const {
  // An op smaller than the smallest piece that may be lent lends nothing:
  // the latency path skips the look-ups.
  size_t lendsFrom = ~size_t{0};
  if (executor->usesReferences()) lendsFrom = knobs.directBytes;
  if (executor->usesAddresses()) lendsFrom = std::min(lendsFrom, executor->addressFrom());
  for (size_t i = 0; i < count; ++i) {
    if (ops[i].info.count * lanes[i].elemSize < lendsFrom) continue;
    // A send issued alone lends nothing: it would then finish only once
    // its receiver read it, and that receive may come after later ops of
    // the receiver's that wait for this rank's (a send each way, or a send
    // before a collective that the peer issues first). Its pieces go
    // through slots, eager as ever. In a group, sends and their receives
    // progress together (NCCL's rule for sends that must), so they may.
    if (ops[i].pointToPoint() && count == 1) continue;
    const Extents mine = extentsOf(ops[i], nranks);
    // An input that this op (in place) or another op of the group writes
    // is never lent.
    bool written = false;
    for (size_t j = 0; j < count && !written; ++j) {
      const Extents other = j == i ? mine : extentsOf(ops[j], nranks);
      written = overlap(mine.in, mine.inBytes, other.out, other.outBytes);
    }
    lanes[i].inputSettled = mine.inBytes && !written;
    if (!executor->usesReferences() || ops[i].info.count * lanes[i].elemSize < knobs.directBytes)
      continue;
    if (lanes[i].inputSettled) lanes[i].inputRegion = memory::find(mine.in);
    if (mine.outBytes) lanes[i].outputRegion = memory::find(mine.out);
  }
}

void Communicator::Impl::execute(PendingOp* ops, size_t count) {
  exec::Lane single;
  std::vector<exec::Lane> many;
  exec::Lane* lanes = &single;
  if (count > 1) {
    many.resize(count);
    lanes = many.data();
  }
  size_t bytes = 0;           // the largest buffer of the group
  bool firstInPlace = false;  // whether ops[0]'s input and output overlap
  for (size_t i = 0; i < count; ++i) {
    const PendingOp& op = ops[i];
    exec::Lane& lane = lanes[i];
    lane.plan = op.plan;
    lane.input = static_cast<const std::byte*>(op.input);
    lane.output = static_cast<std::byte*>(op.output);
    lane.type = op.info.type;
    lane.elemSize = dataTypeSize(op.info.type);
    lane.op = op.info.op;
    lane.kernel = op.info.reduces ? reduce::kernelFor(op.info.type, op.info.op) : nullptr;
    lane.nranks = nranks;
    lane.tag = op.tag;
    lane.info = &op.info;
    // In place, the output was read moments before it is written (the
    // plans send a part first, then receive into it): it is in the cache.
    const Extents extents = extentsOf(op, nranks);
    const bool inPlace = overlap(extents.in, extents.inBytes, extents.out, extents.outBytes);
    lane.streamOutput = knobs.streamBytes != 0 && extents.outBytes >= knobs.streamBytes && !inPlace;
    bytes = std::max({bytes, extents.inBytes, extents.outBytes});
    if (i == 0) firstInPlace = inPlace;
  }
  // Collectives from 4 KiB choose how their pieces cross as they run (see
  // tuning/copy_choice.h), reading the clock when the choice says so;
  // smaller ops take slots and read no clock (a clock read costs a good
  // part of a small op).
  const bool chooses = copyChoice && bytes >= tuning::CopyChoice::kSmallestOp;
  const bool counted = chooses && count == 1 && !ops[0].pointToPoint() && !ops[0].tunerTrial;
  unsigned kind = 0;  // its collective, in place or not; a group's is its own
  tuning::CopyPath path = tuning::CopyPath::Slots;
  if (chooses) {
    kind = count > 1 ? tuning::CopyChoice::kKinds - 1
                     : static_cast<unsigned>(ops[0].kind) * 2 + firstInPlace;
    path = counted ? copyChoice->next(kind, bytes) : copyChoice->chosen(kind, bytes);
  }
  const bool timed = counted && copyChoice->timesLast(kind, bytes);
  if (copyChoice) {
    executor->sendByAddressFrom(path == tuning::CopyPath::Address ? copyChoice->pieceFrom() : 0);
    executor->streamSlots(path == tuning::CopyPath::StreamedSlots);
  }
  if (executor->usesReferences() || executor->usesAddresses()) findRegions(ops, lanes, count);
  std::optional<Error> failure;
  running.store(true, std::memory_order_relaxed);
  try {
    throwIfFailed();
    const auto start =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    executor->run(lanes, count, timeout(), aborted);
    if (timed &&
        copyChoice->record(
            kind, bytes, path,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()))
      BRAID_DEBUG(Exec,
                  "%s ops of %zu KiB now send their large pieces %s (per KiB: %.3g us through "
                  "slots, %.3g us with streaming stores, %.3g us by address)",
                  ops[0].info.name, bytes / 1024,
                  tuning::copyPathName(copyChoice->chosen(kind, bytes)),
                  copyChoice->secondsPerByte(kind, bytes, tuning::CopyPath::Slots) * 1024e6,
                  copyChoice->secondsPerByte(kind, bytes, tuning::CopyPath::StreamedSlots) * 1024e6,
                  copyChoice->secondsPerByte(kind, bytes, tuning::CopyPath::Address) * 1024e6);
  } catch (const Error& error) {
    failedToRun(error);
    failure = error;
  } catch (const std::exception& error) {  // e.g. bad_alloc: the op's state is unknown
    failure = Error(ErrorCode::Internal, format("braid rank %d: %s: %s", rank,
                                                ops[0].info.describe().c_str(), error.what()));
    recordFailure(*failure);
    giveUp(-1);
  }
  running.store(false, std::memory_order_relaxed);
  if (failure) {
    for (size_t i = 0; i < count; ++i)
      if (ops[i].work) ops[i].work->complete(&*failure);
    throw *failure;
  }
  uint64_t completed = completedSeq.load(std::memory_order_relaxed);
  for (size_t i = 0; i < count; ++i) {
    if (!ops[i].pointToPoint()) completed = std::max(completed, ops[i].info.seq + 1);
    if (ops[i].work) ops[i].work->complete(nullptr);
  }
  completedSeq.store(completed, std::memory_order_relaxed);
}

void Communicator::Impl::failedToRun(const Error& error) {
  if (error.code() == ErrorCode::Timeout && knobs.dumpOnTimeout)
    diagnose::report(*this, "timed out");
  executor->forgetFailedOp();
  recordFailure(error);
  giveUp(executor->blamedRank());
}

void Communicator::Impl::executeOnDevice(PendingOp* ops, size_t count) {
  std::vector<exec::DeviceLane> lanes(count);
  std::vector<device::StreamHandle> streams;
  std::vector<std::shared_ptr<Work::State>> works;
  uint64_t lastSeq = 0;
  bool collective = false;
  for (size_t i = 0; i < count; ++i) {
    const PendingOp& op = ops[i];
    exec::DeviceLane& lane = lanes[i];
    lane.plan = op.plan;
    lane.input = static_cast<const std::byte*>(op.input);
    lane.output = static_cast<std::byte*>(op.output);
    lane.type = op.info.type;
    lane.op = op.info.op;
    lane.nranks = nranks;
    lane.pointToPoint = op.pointToPoint();
    lane.tag = op.tag;
    lane.info = op.info;
    lane.peerInputs = std::move(ops[i].peerInputs);  // (read only while lowering, below)
    lane.peerOutputs = std::move(ops[i].peerOutputs);
    if (std::find(streams.begin(), streams.end(), op.deviceStream) == streams.end())
      streams.push_back(op.deviceStream);
    works.push_back(op.work);
    if (!op.pointToPoint()) {
      collective = true;
      lastSeq = std::max(lastSeq, op.info.seq + 1);
    }
  }
  auto done = [this, works = std::move(works), lastSeq, collective](const Error* error) {
    if (!error && collective) {  // for hang reports: collectives done here
      uint64_t seen = completedSeq.load(std::memory_order_relaxed);
      while (seen < lastSeq && !completedSeq.compare_exchange_weak(seen, lastSeq)) {
      }
    }
    for (const auto& work : works)
      if (work) work->complete(error);
  };
  try {
    throwIfFailed();
    if (captureDevice(ops, count, streams)) {
      deviceExecutor->enqueueCaptured(lanes.data(), count, streams[0]);
      for (size_t i = 0; i < count; ++i)
        if (ops[i].work) {
          std::lock_guard<std::mutex> lock(ops[i].work->mutex);
          ops[i].work->captured = true;
        }
      done(nullptr);
      return;
    }
    deviceExecutor->enqueue(lanes.data(), count, streams.data(), streams.size(), done);
  } catch (const Error& error) {
    done(&error);
    throw;
  }
}

bool Communicator::Impl::captureDevice(const PendingOp* ops, size_t,
                                       const std::vector<device::StreamHandle>& streams) {
  size_t capturing = 0;
  for (device::StreamHandle stream : streams) capturing += device->capturing(stream) ? 1 : 0;
  if (capturing == 0) return false;
  if (capturing != streams.size() || streams.size() > 1)
    fail(ErrorCode::InvalidUsage, rank,
         format("%s: a group captured into a CUDA graph issues every op on the one stream being "
                "captured (this group uses %zu streams, %zu of them capturing)",
                ops[0].info.describe().c_str(), streams.size(), capturing));
  if (!deviceExecutor->hasGraphFifos())
    fail(ErrorCode::InvalidUsage, rank,
         format("%s: the stream is being captured into a CUDA graph, and this communicator "
                "cannot capture device ops: %s",
                ops[0].info.describe().c_str(), noGraphs.c_str()));
  return true;
}

void Communicator::Impl::waitForAsyncIdle() {
  if (outstanding.load(std::memory_order_acquire) == 0) return;  // the latency path: no lock
  std::unique_lock<std::mutex> lock(queueMutex);
  queueChanged.wait(lock, [&] { return outstanding == 0; });
}

void Communicator::Impl::enqueue(std::vector<PendingOp> ops) {
  std::lock_guard<std::mutex> lock(queueMutex);
  if (!progressThread.joinable()) progressThread = std::thread([this] { progressLoop(); });
  queue.push_back(std::move(ops));
  ++outstanding;
  queueChanged.notify_all();
}

void Communicator::Impl::progressLoop() {
  std::unique_lock<std::mutex> lock(queueMutex);
  for (;;) {
    queueChanged.wait(lock, [&] { return stopping || !queue.empty(); });
    if (queue.empty()) return;  // stopping, and nothing left to run
    std::vector<PendingOp> ops = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    try {
      execute(ops.data(), ops.size());
    } catch (...) {
      // Delivered through each op's Work.
    }
    lock.lock();
    --outstanding;
    queueChanged.notify_all();
  }
}

namespace {

// A message tag that differs when two ranks issue different ops: the low 16
// bits are the op's sequence number, the next 15 a hash of what the op is
// (collective, count, type, op, root), the top bit says point-to-point.
// (Send and recv hash only count and type, which both ends share.) Each
// part has its own multiplier, so the multiplies run side by side, and one
// more mixes them (a chain of one multiply per part was 11 % of the samples
// of a 1-rank 8 B all-reduce).
uint32_t tagFor(const PendingOp& op) {
  uint64_t what = 0;
  if (!op.pointToPoint())
    what = static_cast<uint64_t>(op.kind) |
           (op.info.reduces ? static_cast<uint64_t>(op.info.op) : 99) << 8 |
           static_cast<uint64_t>(static_cast<uint32_t>(op.info.root + 1)) << 16;
  // (Ranks that disagree on windows fail, naming the mismatch.)
  const uint64_t type = static_cast<uint64_t>(op.info.type) << 1 | (op.shape.mapped ? 1 : 0);
  uint64_t h = what * 0x9e3779b97f4a7c15ull ^ op.info.count * 0xc2b2ae3d27d4eb4full ^
               type * 0x165667b19e3779f9ull;
  h = (h ^ h >> 31) * 0xbf58476d1ce4e5b9ull;
  const uint32_t shape = static_cast<uint32_t>(h >> 49);  // its top 15 bits
  return (op.pointToPoint() ? 0x80000000u : 0u) | shape << 16 |
         static_cast<uint32_t>(op.info.seq & 0xffff);
}

}  // namespace

int Communicator::Impl::awaitSender(size_t count, DataType type) {
  waitForAsyncIdle();  // the executor is this thread's from here
  // Each peer's next send to this rank carries the tag of the receive
  // from it that this rank would issue now. Its number alone picks the
  // message; a count or type that differs then fails as any receive does.
  PendingOp next;
  next.kind = Collective::Recv;
  next.info.count = count;
  next.info.type = type;
  std::vector<uint32_t> tags(static_cast<size_t>(nranks), 0);
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    next.info.seq = recvSeq[static_cast<size_t>(peer)];
    tags[static_cast<size_t>(peer)] = tagFor(next);
  }
  constexpr uint32_t kPointToPointAndNumber = 0x8000ffffu;
  exec::OpInfo info;
  info.name = "recvFromAny";
  info.seq = anySourceReceives;
  info.count = count;
  info.type = type;
  int peer = -1;
  running.store(true, std::memory_order_relaxed);
  try {
    throwIfFailed();
    peer = executor->awaitSender(info, tags, kPointToPointAndNumber, nextAnySource, timeout(),
                                 aborted);
  } catch (const Error& error) {
    failedToRun(error);
    running.store(false, std::memory_order_relaxed);
    throw;
  }
  running.store(false, std::memory_order_relaxed);
  ++anySourceReceives;
  nextAnySource = (peer + 1) % nranks;
  return peer;
}

void Communicator::Impl::resolvePlan(PendingOp& op, bool keep) {
  PlanCache& cache = op.onDevice ? devicePlans : plans;
  if (op.preference) {  // the call's own selection
    algo::Algorithm chosen;
    if (tuning::preferred(op.kind, op.shape, *op.preference, &chosen)) {
      op.keepPlan = cache.remember(chosen, algo::makePlan(op.kind, chosen, op.shape));
      op.plan = op.keepPlan.get();
      return;
    }
    if (op.forcePreference)
      fail(ErrorCode::InvalidArgument, rank,
           format("%s: its algorithm selection (%s) has no algorithm for this call",
                  op.info.describe().c_str(), op.preference->describe().c_str()));
  }
  try {
    op.plan = cache.get(op.kind, op.shape).get();
  } catch (const Error& error) {
    // The first call of a size class times its algorithms with the other
    // ranks (timeContenders), and a trial failed: name the call as well.
    std::string what = error.what();
    const std::string mine = format("braid rank %d: ", rank);
    if (what.compare(0, mine.size(), mine) == 0) what.erase(0, mine.size());
    fail(error.code(), rank,
         format("%s, timing its algorithms (the first call of its size): %s",
                op.info.describe().c_str(), what.c_str()));
  }
  // (Its plan is the cache's last one: it was looked up just now.)
  if (keep) op.keepPlan = cache.last();
}

void Communicator::Impl::verifySameCollective(const PendingOp& op) {
  constexpr size_t kFields = 6;
  const int64_t mine[kFields] = {static_cast<int64_t>(op.info.seq),
                                 static_cast<int64_t>(op.kind),
                                 static_cast<int64_t>(op.info.type),
                                 static_cast<int64_t>(op.info.count),
                                 op.info.reduces ? static_cast<int64_t>(op.info.op) : -1,
                                 op.info.root};
  std::vector<int64_t> all(kFields * static_cast<size_t>(nranks));
  algo::Shape shape = shapes[static_cast<size_t>(DataType::Int64)];
  shape.count = kFields;
  const algo::Plan plan = algo::makePlan(
      Collective::AllGather,
      tuning::choose(Collective::AllGather, shape, tuning::AlgoPreference{}, knobs.oneShotBytes),
      shape);
  PendingOp check;
  check.kind = Collective::AllGather;
  check.info.name = "allGather (BRAID_DEBUG_COLLECTIVES check)";
  check.info.seq = nextCollectiveSeq();
  check.info.count = kFields;
  check.info.type = DataType::Int64;
  check.plan = &plan;
  check.input = mine;
  check.output = all.data();
  check.tag = tagFor(check);
  waitForAsyncIdle();  // the check runs on this thread, now
  execute(&check, 1);
  auto describe = [&](const int64_t* f) {
    std::string text =
        format("%s #%lld (count %lld, %s", algo::collectiveName(static_cast<Collective>(f[1])),
               static_cast<long long>(f[0]), static_cast<long long>(f[3]),
               dataTypeName(static_cast<DataType>(f[2])));
    if (f[4] >= 0) text += format(", %s", reduceOpName(static_cast<ReduceOp>(f[4])));
    if (f[5] >= 0) text += format(", root %lld", static_cast<long long>(f[5]));
    return text + ")";
  };
  bool same = true;
  for (size_t r = 1; r < static_cast<size_t>(nranks); ++r)
    same &= std::equal(all.begin(), all.begin() + kFields, all.begin() + r * kFields);
  if (same) return;
  // Group the ranks by what they called.
  std::string message = "BRAID_DEBUG_COLLECTIVES: the ranks called different collectives:";
  std::vector<bool> told(static_cast<size_t>(nranks), false);
  for (size_t r = 0; r < static_cast<size_t>(nranks); ++r) {
    if (told[r]) continue;
    std::string ranks;
    for (size_t q = r; q < static_cast<size_t>(nranks); ++q)
      if (!told[q] && std::equal(all.begin() + r * kFields, all.begin() + (r + 1) * kFields,
                                 all.begin() + q * kFields)) {
        told[q] = true;
        ranks += format("%s%zu", ranks.empty() ? "" : ", ", q);
      }
    message += format(" rank%s %s called %s;", ranks.find(',') != std::string::npos ? "s" : "",
                      ranks.c_str(), describe(&all[r * kFields]).c_str());
  }
  fail(ErrorCode::InvalidUsage, rank, message);
}

Work Communicator::Impl::issue(PendingOp&& op) {
  if (knobs.debugCollectives && !op.pointToPoint()) verifySameCollective(op);
  op.tag = tagFor(op);
  // An op that runs later keeps its plan: the cache may evict it meanwhile.
  if (groupDepth == 0) resolvePlan(op, op.async);
  if (groupDepth > 0) {
    op.work = std::make_shared<Work::State>();
    op.work->inOpenGroup = true;
    Work work(op.work);
    group.push_back(std::move(op));
    return work;
  }
  if (op.onDevice) {
    op.work = std::make_shared<Work::State>();
    Work work(op.work);
    executeOnDevice(&op, 1);
    return work;
  }
  if (op.async) {
    op.work = std::make_shared<Work::State>();
    Work work(op.work);
    std::vector<PendingOp> ops;
    ops.push_back(std::move(op));
    enqueue(std::move(ops));
    return work;
  }
  waitForAsyncIdle();
  execute(&op, 1);
  return Work();  // an empty Work is a completed one
}

algo::Algorithm Communicator::Impl::timeContenders(Collective collective, const algo::Shape& shape,
                                                   const std::vector<algo::Algorithm>& contenders) {
  // 1 + kTimedRounds * (batch + 1) calls per contender, at least
  // PlanCache::kTrialCalls.
  constexpr int kTimedRounds = 5;
  // The element size's usual type, for the reduction kernel's speed.
  DataType type = DataType::Uint8;
  switch (shape.elemSize) {
    case 2:
      type = DataType::BFloat16;
      break;
    case 4:
      type = DataType::Float32;
      break;
    case 8:
      type = DataType::Float64;
      break;
  }
  const bool reduces = collective == Collective::AllReduce || collective == Collective::Reduce ||
                       collective == Collective::ReduceScatter;
  const size_t whole = algo::bufferBytes(collective, shape);
  const size_t one = shape.count * shape.elemSize;
  std::vector<std::byte> in(collective == Collective::ReduceScatter ? whole : one);
  std::vector<std::byte> out(collective == Collective::AllGather ? whole : one);
  static constexpr const char* kNames[] = {"allReduce trial", "broadcast trial", "reduce trial",
                                           "allGather trial", "reduceScatter trial"};

  waitForAsyncIdle();
  std::vector<algo::Plan> plans;
  for (algo::Algorithm a : contenders) plans.push_back(algo::makePlan(collective, a, shape));
  // Rounds take the contenders in turn, so that a slow spell of the machine
  // slows them alike; the first round only touches every page. In a round,
  // a contender runs once untimed (the ranks leave the previous contender
  // at different moments), then a few times back to back, timed together,
  // as a loop of calls would run.
  const int batch = static_cast<int>(std::clamp<size_t>((size_t{256} << 10) / whole, 2, 16));
  std::vector<std::vector<double>> runs(contenders.size());
  for (int round = 0; round <= kTimedRounds; ++round)
    for (size_t i = 0; i < contenders.size(); ++i) {
      auto start = Clock::now();
      for (int call = 0; call <= (round ? batch : 0); ++call) {
        if (call == 1) start = Clock::now();
        PendingOp op;
        op.kind = collective;
        op.info.name = kNames[static_cast<size_t>(collective)];
        op.info.seq = nextCollectiveSeq();
        op.info.count = shape.count;
        op.info.type = type;
        op.info.reduces = reduces;
        op.info.root = collective == Collective::Broadcast || collective == Collective::Reduce
                           ? shape.root
                           : -1;
        op.plan = &plans[i];
        op.input = in.data();
        op.output = out.data();
        op.tag = tagFor(op);
        op.tunerTrial = true;
        execute(&op, 1);
      }
      if (round > 0)
        runs[i].push_back(std::chrono::duration<double>(Clock::now() - start).count() / batch);
    }
  std::vector<double> seconds;  // each contender's median round on this rank
  for (std::vector<double>& times : runs) {
    std::nth_element(times.begin(), times.begin() + kTimedRounds / 2, times.end());
    seconds.push_back(times[kTimedRounds / 2]);
  }

  // The slowest rank's median of each: the same numbers on every rank.
  algo::Shape agree = shapes[static_cast<size_t>(DataType::Float64)];
  agree.count = seconds.size();
  const algo::Plan plan = algo::makePlan(
      Collective::AllReduce,
      tuning::choose(Collective::AllReduce, agree, tuning::AlgoPreference{}, knobs.oneShotBytes),
      agree);
  std::vector<double> slowest(seconds.size());
  PendingOp op;
  op.kind = Collective::AllReduce;
  op.info.name = "allReduce (tuning agreement)";
  op.info.seq = nextCollectiveSeq();
  op.info.count = seconds.size();
  op.info.type = DataType::Float64;
  op.info.op = ReduceOp::Max;
  op.info.reduces = true;
  op.plan = &plan;
  op.input = seconds.data();
  op.output = slowest.data();
  op.tag = tagFor(op);
  execute(&op, 1);

  // The fastest, unless an earlier contender (the model's favourite first)
  // is within 3%: a difference that small is noise.
  size_t best = 0;
  for (size_t i = 1; i < slowest.size(); ++i)
    if (slowest[i] < slowest[best]) best = i;
  for (size_t i = 0; i < best; ++i)
    if (slowest[i] <= slowest[best] * 1.03) {
      best = i;
      break;
    }
  if (log::enabled(log::Level::Info, log::Subsys::Coll)) {
    std::string times;
    for (size_t i = 0; i < slowest.size(); ++i)
      times += format("%s%s %.3g us", i ? ", " : "", algo::algorithmName(contenders[i]),
                      slowest[i] * 1e6);
    BRAID_INFO(Coll, "tuning %s of %zu bytes: %s: %s", algo::collectiveName(collective), whole,
               times.c_str(), algo::algorithmName(contenders[best]));
  }
  return contenders[best];
}

}  // namespace braid
