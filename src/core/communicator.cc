#include "braid/communicator.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "core/calibrate.h"
#include "core/communicator_impl.h"
#include "core/diagnose.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "core/log.h"
#include "core/memory.h"
#include "tuning/cost_model.h"

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;

net::Deadline deadlineAfter(std::chrono::milliseconds timeout) { return Clock::now() + timeout; }

uint64_t randomSecret() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The local address to listen on: the configured interface, else the one
// that routes to the root.
net::Address listenAddressFor(const net::Address& root, const Knobs& knobs) {
  if (!knobs.socketIfname.empty()) return net::interfaceAddress(knobs.socketIfname);
  return net::routeTo(root);
}

int localRanks(const bootstrap::Bootstrap& bootstrap) {
  const std::string& host = bootstrap.table()[bootstrap.rank()].hostId;
  return static_cast<int>(std::count_if(bootstrap.table().begin(), bootstrap.table().end(),
                                        [&](const auto& peer) { return peer.hostId == host; }));
}

int usableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// Plans and connections are built from knobs each rank reads for itself;
// ranks that read different values would build plans that do not match.
void checkKnobsAgree(bootstrap::Bootstrap& bootstrap, const Knobs& knobs, net::Deadline deadline) {
  struct Shared {
    uint64_t slotBytes, slots, chunkBytes, oneShotBytes, algo, tuning, deterministic;
    char transports[48];
  };
  std::vector<Shared> all(bootstrap.size());
  Shared& mine = all[bootstrap.rank()];
  std::memset(&mine, 0, sizeof(mine));
  mine.slotBytes = knobs.slotBytes;
  mine.slots = static_cast<uint64_t>(knobs.slots);
  mine.chunkBytes = knobs.chunkBytes;
  mine.oneShotBytes = knobs.oneShotBytes;
  mine.tuning = static_cast<uint64_t>(knobs.tuning);
  mine.deterministic = knobs.deterministic ? 1 : 0;
  // BRAID_ALGO by a hash of its meaning (the same list may be spelled apart).
  const std::string algo = tuning::AlgoPreference::parse(knobs.algo).describe();
  mine.algo = 0xcbf29ce484222325ull;
  for (char c : algo) mine.algo = (mine.algo ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  std::snprintf(mine.transports, sizeof(mine.transports), "%s", knobs.transports.c_str());
  bootstrap.allGather(all.data(), sizeof(Shared), deadline);
  for (int r = 0; r < bootstrap.size(); ++r) {
    const Shared& theirs = all[r];
    auto differ = [&](const char* knob, const std::string& a, const std::string& b) {
      fail(ErrorCode::InvalidArgument, bootstrap.rank(),
           format("%s must be the same on every rank: rank %d has %s, rank %d has %s", knob,
                  bootstrap.rank(), a.c_str(), r, b.c_str()));
    };
    if (theirs.slotBytes != mine.slotBytes)
      differ("BRAID_SLOT_BYTES", std::to_string(mine.slotBytes), std::to_string(theirs.slotBytes));
    if (theirs.slots != mine.slots)
      differ("BRAID_SLOTS", std::to_string(mine.slots), std::to_string(theirs.slots));
    if (theirs.chunkBytes != mine.chunkBytes)
      differ("BRAID_CHUNK_BYTES (Config::chunkBytes)", std::to_string(mine.chunkBytes),
             std::to_string(theirs.chunkBytes));
    if (theirs.oneShotBytes != mine.oneShotBytes)
      differ("BRAID_ONESHOT_BYTES", std::to_string(mine.oneShotBytes),
             std::to_string(theirs.oneShotBytes));
    if (theirs.tuning != mine.tuning)
      differ("BRAID_TUNING", tuningName(knobs.tuning),
             theirs.tuning <= 2 ? tuningName(static_cast<Tuning>(theirs.tuning)) : "?");
    if (theirs.deterministic != mine.deterministic)
      differ("BRAID_DETERMINISTIC", std::to_string(mine.deterministic),
             std::to_string(theirs.deterministic));
    if (theirs.algo != mine.algo)
      differ("BRAID_ALGO", format("'%s'", knobs.algo.c_str()), "another list");
    if (std::strncmp(theirs.transports, mine.transports, sizeof(mine.transports)) != 0)
      differ("BRAID_TRANSPORT (Config::transports)", format("'%s'", mine.transports),
             format("'%.47s'", theirs.transports));
  }
}

// Argument checks. Each throws InvalidArgument naming the argument; none
// changes the communicator, so it stays usable.
class Checker {
 public:
  Checker(const Communicator::Impl& impl, const char* op) : impl_(impl), op_(op) {}

  [[noreturn]] void reject(const std::string& why) const {
    fail(ErrorCode::InvalidArgument, impl_.rank, format("%s: %s", op_, why.c_str()));
  }
  void type(DataType type) const {
    if (!isValid(type))
      reject(format("argument 'type' (%d) is not a braid::DataType", static_cast<int>(type)));
  }
  void op(ReduceOp op) const {
    if (!isValid(op))
      reject(format("argument 'op' (%d) is not a braid::ReduceOp", static_cast<int>(op)));
  }
  void rank(const char* name, int value) const {
    if (value < 0 || value >= impl_.nranks)
      reject(format("argument '%s' is %d, not a rank of this %d-rank communicator", name, value,
                    impl_.nranks));
  }
  // count * blocks elements of `type` must be addressable.
  void size(const char* name, size_t count, DataType type, size_t blocks = 1) const {
    size_t bytes = 0;
    if (__builtin_mul_overflow(count, dataTypeSize(type) * blocks, &bytes) ||
        bytes > std::numeric_limits<size_t>::max() / 2)
      reject(format("argument '%s' (%zu) times the %s element size%s overflows", name, count,
                    dataTypeName(type), blocks > 1 ? " and the rank count" : ""));
  }
  void buffer(const char* name, const void* pointer, size_t count) const {
    if (pointer == nullptr && count > 0)
      reject(format("argument '%s' is null but count is %zu", name, count));
  }

 private:
  const Communicator::Impl& impl_;
  const char* op_;
};

}  // namespace

// ---------------------------------------------------------------- Work

void Work::State::complete(std::exception_ptr failure) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    error = std::move(failure);
    finished = true;
  }
  done.notify_all();
}

bool Work::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished;
}

void Work::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->finished && state_->inOpenGroup)
    throw Error(ErrorCode::InvalidUsage,
                "braid: wait() on an op of a group that has not ended: call groupEnd() first");
  state_->done.wait(lock, [&] { return state_->finished; });
  if (state_->error) std::rethrow_exception(state_->error);
}

// ---------------------------------------------------------------- Impl

Communicator::Impl::Impl(std::unique_ptr<bootstrap::Bootstrap> boot, const Knobs& k)
    : rank(boot->rank()),
      nranks(boot->size()),
      knobs(k),
      bootstrap(std::move(boot)),
      sendSeq(nranks, 0),
      recvSeq(nranks, 0) {
  for (int t = 0; t < kNumDataTypes; ++t) {
    algo::Shape& shape = shapes[static_cast<size_t>(t)];
    shape.nranks = nranks;
    shape.rank = rank;
    const size_t size = dataTypeSize(static_cast<DataType>(t));
    shape.elemSize = size;
    shape.alignElems = std::max<size_t>(1, 64 / size);  // chunks start on cache lines
    shape.chunkElems =
        std::max(shape.alignElems, knobs.chunkBytes / size / shape.alignElems * shape.alignElems);
  }
  checkKnobsAgree(*bootstrap, knobs, deadlineAfter(knobs.timeout));
  wiring = transport::wireUp(
      {*bootstrap, knobs.slotBytes, knobs.slots, deadlineAfter(knobs.timeout)}, knobs.transports);
  executor = std::make_unique<exec::Executor>(
      wiring, rank, knobs.slotBytes, localRanks(*bootstrap) <= usableCores(), knobs.directBytes);
  if (knobs.tuning != Tuning::Fixed) {
    // Every rank must choose alike, so all model the same links. Without a
    // measurement that is the slowest transport any rank uses (tcp if any
    // pair talks over it); a measurement is taken where every pair talks
    // over one kind of transport (else it would time only some of them).
    std::vector<uint8_t> kinds(static_cast<size_t>(nranks), 0);
    for (const std::string& name : wiring.names)
      if (name != "self") kinds[rank] |= name == "shm" ? 1 : 2;
    bootstrap->allGather(kinds.data(), 1, deadlineAfter(knobs.timeout));
    uint8_t used = 0;
    for (uint8_t k : kinds) used |= k;
    algo::LinkModel link = tuning::defaultLink(used & 2 ? "tcp" : "shm");
    if (knobs.deterministic)
      link = tuning::defaultLink("shm");  // the same choice over every transport
    else if (knobs.tuning == Tuning::Measured && nranks > 1 && used != 3)
      link = calibrateLink(*executor, *bootstrap, wiring, knobs.timeout, aborted, link);
    plans.useModel(link);
    if (knobs.tuning == Tuning::Measured && !knobs.deterministic && nranks > 1)
      plans.timeWith([this](Collective collective, const algo::Shape& shape,
                            const std::vector<algo::Algorithm>& contenders) {
        return timeContenders(collective, shape, contenders);
      });
  }
  diagnose::add(this);
}

Communicator::Impl::~Impl() {
  diagnose::remove(this);
  if (!group.empty())
    dropGroup(std::make_exception_ptr(
        Error(ErrorCode::Aborted,
              format("braid rank %d: the communicator was destroyed inside a group", rank))));
  {
    std::lock_guard<std::mutex> lock(queueMutex);
    stopping = true;
  }
  queueChanged.notify_all();
  if (progressThread.joinable()) progressThread.join();
}

void Communicator::Impl::throwIfFailed() const {
  if (!failed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(failureMutex);
  if (failure)
    throw Error(failure->code(), format("braid rank %d: the communicator failed earlier: %s", rank,
                                        failure->what()));
}

void Communicator::Impl::recordFailure(const Error& error) {
  std::lock_guard<std::mutex> lock(failureMutex);
  if (!failure) failure = error;
  failed.store(true, std::memory_order_release);
}

void Communicator::Impl::giveUp(int blamed) {
  if (gaveUp) return;
  gaveUp = true;
  for (auto& transport : wiring.transports)
    transport->announceFailure(blamed, executor->blamedTimedOut());
}

void Communicator::Impl::dropGroup(std::exception_ptr error) {
  for (PendingOp& op : group) {
    {
      std::lock_guard<std::mutex> lock(op.work->mutex);
      op.work->inOpenGroup = false;
    }
    op.work->complete(error);
  }
  group.clear();
}

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
  if (op.collective == Collective::AllGather) outBytes *= static_cast<size_t>(nranks);
  if (op.collective == Collective::ReduceScatter) inBytes *= static_cast<size_t>(nranks);
  return {static_cast<const std::byte*>(op.input), op.input ? inBytes : 0,
          static_cast<const std::byte*>(op.output), op.output ? outBytes : 0};
}

bool overlap(const std::byte* a, size_t aBytes, const std::byte* b, size_t bBytes) {
  return aBytes && bBytes && a < b + bBytes && b < a + aBytes;
}

}  // namespace

void Communicator::Impl::findRegions(const PendingOp* ops, exec::Lane* lanes, size_t count) const {
  for (size_t i = 0; i < count; ++i) {
    if (ops[i].info.count * lanes[i].elemSize < knobs.directBytes) continue;
    const Extents mine = extentsOf(ops[i], nranks);
    // An input that this op (in place) or another op of the group writes
    // is never lent.
    bool written = false;
    for (size_t j = 0; j < count && !written; ++j) {
      const Extents other = j == i ? mine : extentsOf(ops[j], nranks);
      written = overlap(mine.in, mine.inBytes, other.out, other.outBytes);
    }
    if (mine.inBytes && !written) lanes[i].inputRegion = memory::find(mine.in);
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
  }
  if (executor->usesReferences()) findRegions(ops, lanes, count);
  std::exception_ptr failure;
  try {
    throwIfFailed();
    executor->run(lanes, count, knobs.timeout, aborted);
  } catch (const Error& error) {
    if (error.code() == ErrorCode::Timeout && knobs.dumpOnTimeout)
      diagnose::report(*this, "timed out");
    recordFailure(error);
    giveUp(executor->blamedRank());
    failure = std::current_exception();
  } catch (const std::exception& error) {  // e.g. bad_alloc: the op's state is unknown
    Error internal(ErrorCode::Internal, format("braid rank %d: %s: %s", rank,
                                               ops[0].info.describe().c_str(), error.what()));
    recordFailure(internal);
    giveUp(-1);
    failure = std::make_exception_ptr(internal);
  }
  if (failure) {
    for (size_t i = 0; i < count; ++i)
      if (ops[i].work) ops[i].work->complete(failure);
    std::rethrow_exception(failure);
  }
  uint64_t completed = completedSeq.load(std::memory_order_relaxed);
  for (size_t i = 0; i < count; ++i) {
    if (!ops[i].pointToPoint) completed = std::max(completed, ops[i].info.seq + 1);
    if (ops[i].work) ops[i].work->complete(nullptr);
  }
  completedSeq.store(completed, std::memory_order_relaxed);
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
// (Send and recv hash only count and type, which both ends share.)
uint32_t tagFor(const PendingOp& op) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
  if (!op.pointToPoint) {
    mix(static_cast<uint64_t>(op.collective));
    mix(op.info.reduces ? static_cast<uint64_t>(op.info.op) : 99);
    mix(static_cast<uint64_t>(op.info.root + 1));
  }
  mix(op.info.count);
  mix(static_cast<uint64_t>(op.info.type));
  uint32_t shape = static_cast<uint32_t>(h ^ (h >> 32)) & 0x7fff;
  return (op.pointToPoint ? 0x80000000u : 0u) | shape << 16 |
         static_cast<uint32_t>(op.info.seq & 0xffff);
}

}  // namespace

void Communicator::Impl::resolvePlan(PendingOp& op, bool keep) {
  op.plan = plans.get(op.planned, op.shape).get();
  // (Its plan is the cache's last one: it was looked up just now.)
  if (keep) op.keepPlan = plans.last();
}

void Communicator::Impl::verifySameCollective(const PendingOp& op) {
  constexpr size_t kFields = 6;
  const int64_t mine[kFields] = {static_cast<int64_t>(op.info.seq),
                                 static_cast<int64_t>(op.collective),
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
  check.collective = Collective::AllGather;
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
  if (knobs.debugCollectives && !op.pointToPoint) verifySameCollective(op);
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
        op.collective = collective;
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
  op.collective = Collective::AllReduce;
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

// ---------------------------------------------------------------- Communicator

Communicator::Communicator() = default;
Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

UniqueId Communicator::newUniqueId(const Config& config) {
  Knobs knobs = Knobs::resolve(config);
  net::Address at = knobs.socketIfname.empty() ? net::defaultLocalAddress()
                                               : net::interfaceAddress(knobs.socketIfname);
  net::Listener listener(at);
  bootstrap::IdContents contents{listener.address(), randomSecret()};
  bootstrap::startRoot(std::move(listener), contents.secret, knobs.timeout);
  return bootstrap::encodeId(contents);
}

Communicator Communicator::init(int nranks, int rank, const UniqueId& id, const Config& config) {
  if (nranks < 1)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: init: argument 'nranks' is %d, must be at least 1", nranks));
  if (rank < 0 || rank >= nranks)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: init: argument 'rank' is %d, not in [0, %d)", rank, nranks));
  Knobs knobs = Knobs::resolve(config);
  bootstrap::IdContents contents = bootstrap::decodeId(id);
  log::setRank(rank);
  net::Deadline deadline = deadlineAfter(knobs.timeout);
  auto boot = bootstrap::Bootstrap::join(id, nranks, rank, listenAddressFor(contents.root, knobs),
                                         deadline);
  auto impl = std::make_unique<Impl>(std::move(boot), knobs);
  BRAID_INFO(Init, "rank %d of %d ready", rank, nranks);
  return Communicator(std::move(impl));
}

namespace {

Communicator::Impl& usable(Communicator::Impl* impl, const char* op) {
  if (!impl)
    throw Error(ErrorCode::InvalidUsage,
                format("braid: %s on an empty communicator handle (moved from, or split with a "
                       "negative color)",
                       op));
  impl->throwIfFailed();
  return *impl;
}

algo::Shape shapeFor(const Communicator::Impl& impl, size_t count, DataType type) {
  algo::Shape shape = impl.shapes[static_cast<size_t>(type)];
  shape.count = count;
  return shape;
}

PendingOp collectiveOp(Communicator::Impl& impl, Collective collective, const char* name,
                       const algo::Shape& shape, DataType type, const void* input, void* output,
                       Stream stream) {
  PendingOp op;
  op.collective = collective;
  op.info.name = name;
  op.info.seq = impl.nextCollectiveSeq();
  op.info.count = shape.count;
  op.info.type = type;
  op.planned = collective;
  op.shape = shape;
  op.input = input;
  op.output = output;
  op.async = stream.isAsync();
  return op;
}

}  // namespace

Work Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "allReduce");
  Checker check(impl, "allReduce");
  check.type(type);
  check.op(op);
  check.size("count", count, type);
  check.buffer("send", send, count);
  check.buffer("recv", recv, count);
  PendingOp pending = collectiveOp(impl, Collective::AllReduce, "allReduce",
                                   shapeFor(impl, count, type), type, send, recv, stream);
  pending.info.op = op;
  pending.info.reduces = true;
  return impl.issue(std::move(pending));
}

Work Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "broadcast");
  Checker check(impl, "broadcast");
  check.type(type);
  check.rank("root", root);
  check.size("count", count, type);
  if (impl.rank == root) check.buffer("send", send, count);
  check.buffer("recv", recv, count);
  algo::Shape shape = shapeFor(impl, count, type);
  shape.root = root;
  PendingOp pending =
      collectiveOp(impl, Collective::Broadcast, "broadcast", shape, type, send, recv, stream);
  pending.info.root = root;
  return impl.issue(std::move(pending));
}

Work Communicator::reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                          int root, Stream stream) {
  Impl& impl = usable(impl_.get(), "reduce");
  Checker check(impl, "reduce");
  check.type(type);
  check.op(op);
  check.rank("root", root);
  check.size("count", count, type);
  check.buffer("send", send, count);
  if (impl.rank == root) check.buffer("recv", recv, count);
  algo::Shape shape = shapeFor(impl, count, type);
  shape.root = root;
  PendingOp pending =
      collectiveOp(impl, Collective::Reduce, "reduce", shape, type, send, recv, stream);
  pending.info.op = op;
  pending.info.reduces = true;
  pending.info.root = root;
  return impl.issue(std::move(pending));
}

Work Communicator::allGather(const void* send, void* recv, size_t sendCount, DataType type,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "allGather");
  Checker check(impl, "allGather");
  check.type(type);
  check.size("sendCount", sendCount, type, impl.nranks);
  check.buffer("send", send, sendCount);
  check.buffer("recv", recv, sendCount);
  return impl.issue(collectiveOp(impl, Collective::AllGather, "allGather",
                                 shapeFor(impl, sendCount, type), type, send, recv, stream));
}

Work Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, DataType type,
                                 ReduceOp op, Stream stream) {
  Impl& impl = usable(impl_.get(), "reduceScatter");
  Checker check(impl, "reduceScatter");
  check.type(type);
  check.op(op);
  check.size("recvCount", recvCount, type, impl.nranks);
  check.buffer("send", send, recvCount);
  check.buffer("recv", recv, recvCount);
  PendingOp pending = collectiveOp(impl, Collective::ReduceScatter, "reduceScatter",
                                   shapeFor(impl, recvCount, type), type, send, recv, stream);
  pending.info.op = op;
  pending.info.reduces = true;
  return impl.issue(std::move(pending));
}

namespace {

PendingOp pointToPoint(Communicator::Impl& impl, bool sending, const void* input, void* output,
                       size_t count, DataType type, int peer, Stream stream) {
  algo::Shape shape = shapeFor(impl, count, type);
  shape.peer = peer;
  uint64_t& seq = sending ? impl.sendSeq[peer] : impl.recvSeq[peer];
  PendingOp op;
  op.info.name = sending ? "send" : "recv";
  op.info.seq = seq++;
  op.info.count = count;
  op.info.type = type;
  op.info.peer = peer;
  op.planned = sending ? Collective::Send : Collective::Recv;
  op.shape = shape;
  op.input = input;
  op.output = output;
  // The k-th send from A to B meets the k-th receive at B from A.
  op.pointToPoint = true;
  op.async = stream.isAsync();
  return op;
}

}  // namespace

Work Communicator::send(const void* buffer, size_t count, DataType type, int peer, Stream stream) {
  Impl& impl = usable(impl_.get(), "send");
  Checker check(impl, "send");
  check.type(type);
  check.rank("peer", peer);
  check.size("count", count, type);
  check.buffer("buffer", buffer, count);
  return impl.issue(pointToPoint(impl, true, buffer, nullptr, count, type, peer, stream));
}

Work Communicator::recv(void* buffer, size_t count, DataType type, int peer, Stream stream) {
  Impl& impl = usable(impl_.get(), "recv");
  Checker check(impl, "recv");
  check.type(type);
  check.rank("peer", peer);
  check.size("count", count, type);
  check.buffer("buffer", buffer, count);
  return impl.issue(pointToPoint(impl, false, nullptr, buffer, count, type, peer, stream));
}

Work Communicator::barrier(Stream stream) {
  Impl& impl = usable(impl_.get(), "barrier");
  PendingOp pending =
      collectiveOp(impl, Collective::AllReduce, "barrier", shapeFor(impl, 1, DataType::Uint8),
                   DataType::Uint8, &impl.barrierIn, &impl.barrierOut, stream);
  pending.info.op = ReduceOp::Max;
  pending.info.reduces = true;
  return impl.issue(std::move(pending));
}

void Communicator::groupStart() { ++usable(impl_.get(), "groupStart").groupDepth; }

void Communicator::groupEnd() {
  if (!impl_) usable(nullptr, "groupEnd");
  Impl& impl = *impl_;
  if (impl.groupDepth == 0)
    fail(ErrorCode::InvalidUsage, impl.rank, "groupEnd without a matching groupStart");
  if (--impl.groupDepth > 0 || impl.group.empty()) return;
  try {
    impl.throwIfFailed();
  } catch (const Error&) {
    impl.dropGroup(std::current_exception());  // no Work may wait forever
    throw;
  }
  std::vector<PendingOp> ops = std::move(impl.group);
  impl.group.clear();
  try {
    for (PendingOp& op : ops) impl.resolvePlan(op, true);
  } catch (const Error&) {
    impl.group = std::move(ops);
    impl.dropGroup(std::current_exception());
    throw;
  }
  for (PendingOp& op : ops) {
    std::lock_guard<std::mutex> lock(op.work->mutex);
    op.work->inOpenGroup = false;
  }
  bool async = std::any_of(ops.begin(), ops.end(), [](const PendingOp& op) { return op.async; });
  if (async) {
    impl.enqueue(std::move(ops));
    return;
  }
  impl.waitForAsyncIdle();
  impl.execute(ops.data(), ops.size());
}

namespace {
constexpr int32_t kSplitFailed = INT32_MIN;
}  // namespace

Communicator Communicator::split(int color, int key) {
  Impl& impl = usable(impl_.get(), "split");
  if (impl.groupDepth > 0) fail(ErrorCode::InvalidUsage, impl.rank, "split inside a group");
  impl.waitForAsyncIdle();
  net::Deadline deadline = deadlineAfter(impl.knobs.timeout);

  struct Entry {
    int32_t color;
    int32_t key;
    char listen[64];
  };
  std::optional<net::Listener> listener;
  std::vector<Entry> entries(impl.nranks);
  Entry& mine = entries[impl.rank];
  std::memset(&mine, 0, sizeof(mine));
  mine.color = color < 0 ? -1 : color;
  mine.key = key;
  std::string problem;
  if (color >= 0) {
    try {
      net::Address at = impl.bootstrap->listenAddress();
      at.setPort(0);
      listener.emplace(at);
      std::snprintf(mine.listen, sizeof(mine.listen), "%s", listener->address().toString().c_str());
    } catch (const Error& error) {
      problem = error.what();
      mine.color = kSplitFailed;  // still take part, so every rank learns of it
    }
  }
  try {
    impl.bootstrap->allGather(entries.data(), sizeof(Entry), deadline);
  } catch (const Error& error) {
    impl.recordFailure(error);
    throw;
  }
  ++impl.splits;
  if (!problem.empty()) throw Error(ErrorCode::SystemError, problem);
  for (int r = 0; r < impl.nranks; ++r)
    if (entries[r].color == kSplitFailed)
      fail(ErrorCode::RemoteError, impl.rank,
           format("split: rank %d could not open a listener for the new communicator", r));
  const uint64_t splitIndex = impl.splits;
  if (color < 0) return Communicator();

  std::vector<int> members;
  for (int r = 0; r < impl.nranks; ++r)
    if (entries[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return entries[a].key < entries[b].key; });
  std::vector<bootstrap::PeerInfo> table;
  int newRank = -1;
  for (int r : members) {
    if (r == impl.rank) newRank = static_cast<int>(table.size());
    entries[r].listen[sizeof(entries[r].listen) - 1] = '\0';
    table.push_back({net::Address::parse(entries[r].listen, "split listen address"),
                     impl.bootstrap->table()[r].hostId});
  }
  uint64_t secret = mix(impl.bootstrap->secret() ^ mix(splitIndex) ^
                        mix(static_cast<uint64_t>(static_cast<uint32_t>(color)) + 0x5851F42Dull));
  auto boot = bootstrap::Bootstrap::fromTable(std::move(*listener), std::move(table), newRank,
                                              secret, deadline);
  return Communicator(std::make_unique<Impl>(std::move(boot), impl.knobs));
}

void Communicator::abort() {
  if (!impl_) return;
  impl_->recordFailure(Error(ErrorCode::Aborted,
                             format("braid rank %d: the communicator was aborted", impl_->rank)));
  impl_->aborted.store(true);
}

int Communicator::rank() const {
  if (!impl_) throw Error(ErrorCode::InvalidUsage, "braid: rank() on an empty communicator handle");
  return impl_->rank;
}
int Communicator::size() const {
  if (!impl_) throw Error(ErrorCode::InvalidUsage, "braid: size() on an empty communicator handle");
  return impl_->nranks;
}

namespace detail {

std::vector<std::string> peerTransports(const Communicator& comm) {
  if (!comm.impl()) return {};
  return comm.impl()->wiring.names;
}

std::vector<std::string> builtTransports() { return transport::builtTransports(); }

std::string lastAlgorithm(const Communicator& comm) {
  return comm.impl() ? algo::algorithmName(comm.impl()->plans.lastAlgorithm()) : "";
}

bool tuningLink(const Communicator& comm, algo::LinkModel* link) {
  const algo::LinkModel* model = comm.impl() ? comm.impl()->plans.model() : nullptr;
  if (model) *link = *model;
  return model != nullptr;
}

uint64_t piecesSentByReference(const Communicator& comm) {
  return comm.impl() ? comm.impl()->executor->piecesSentByReference() : 0;
}

}  // namespace detail
}  // namespace braid
