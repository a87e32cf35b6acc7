// The public API: Communicator's calls and Work. Each checks its
// arguments (arguments.h), builds the op and hands it to the pipeline
// (pipeline.cc); the communicator's state is communicator_impl.h's.
#include "braid/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "core/arguments.h"
#include "core/call_algorithm.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/memory.h"

namespace braid {
namespace {

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

}  // namespace

// ---------------------------------------------------------------- Work

void Work::State::complete(const Error* failure) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure) {
      errorCode = failure->code();
      errorMessage = failure->what();
    }
    finished = true;
  }
  done.notify_all();
}

bool Work::captured() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->captured;
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
  if (state_->errorCode) throw Error(*state_->errorCode, state_->errorMessage);
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

std::vector<Communicator> Communicator::initAll(const std::vector<int>& devices,
                                                const Config& config) {
  if (devices.empty())
    throw Error(ErrorCode::InvalidArgument, "braid: initAll: argument 'devices' is empty");
  if (device::Device* device = device::current())
    for (size_t i = 0; i < devices.size(); ++i)
      if (devices[i] < 0 || devices[i] >= device->count())
        throw Error(ErrorCode::InvalidArgument,
                    format("braid: initAll: devices[%zu] is %d, and this process has %d %s "
                           "devices (0 to %d)",
                           i, devices[i], device->count(), device->name(), device->count() - 1));
  const int nranks = static_cast<int>(devices.size());
  const UniqueId id = newUniqueId(config);
  std::vector<Communicator> ranks(devices.size());
  std::vector<std::exception_ptr> failures(devices.size());
  auto make = [&](int rank) {
    try {
      Config mine = config;
      mine.device = devices[rank];
      ranks[rank] = init(nranks, rank, id, mine);
    } catch (...) {
      failures[rank] = std::current_exception();
    }
  };
  std::vector<std::thread> others;
  for (int rank = 1; rank < nranks; ++rank) others.emplace_back(make, rank);
  make(0);
  for (std::thread& thread : others) thread.join();
  for (const std::exception_ptr& failure : failures)
    if (failure) std::rethrow_exception(failure);
  return ranks;
}

namespace {

algo::Shape shapeFor(const Communicator::Impl& impl, size_t count, DataType type,
                     bool onDevice = false) {
  algo::Shape shape = (onDevice ? impl.deviceShapes : impl.shapes)[static_cast<size_t>(type)];
  shape.count = count;
  return shape;
}

void placeOn(PendingOp& op, bool onDevice, const Stream& stream) {
  op.async = stream.isAsync();
  op.onDevice = onDevice;
  op.deviceStream = onDevice ? stream.deviceStream() : nullptr;
}

thread_local detail::CallAlgorithm tCallAlgorithm;
// Scopes open on any thread. Most calls are made outside every scope, and
// this count spares them the thread-local look-up (a call into the dynamic
// loader's TLS code from a shared library): a thread that opened a scope
// counted it itself, so it always sees its own.
std::atomic<int> gOpenScopes{0};

PendingOp collectiveOp(Communicator::Impl& impl, Collective collective, const char* name,
                       const algo::Shape& shape, DataType type, const void* input, void* output,
                       Stream stream, bool onDevice) {
  PendingOp op;
  if (gOpenScopes.load(std::memory_order_relaxed) != 0) {
    op.preference = tCallAlgorithm.preference;
    op.forcePreference = tCallAlgorithm.force;
  }
  op.kind = collective;
  op.info.name = name;
  op.info.seq = impl.nextCollectiveSeq();
  op.info.count = shape.count;
  op.info.type = type;
  op.shape = shape;
  op.input = input;
  op.output = output;
  placeOn(op, onDevice, stream);
  if (onDevice) impl.mapBuffers(op);
  return op;
}

}  // namespace

namespace detail {

CallAlgorithmScope::CallAlgorithmScope(CallAlgorithm selection)
    : previous_(std::exchange(tCallAlgorithm, std::move(selection))) {
  gOpenScopes.fetch_add(1, std::memory_order_relaxed);
}

CallAlgorithmScope::~CallAlgorithmScope() {
  tCallAlgorithm = std::move(previous_);
  gOpenScopes.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace detail

Work Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "allReduce");
  ArgumentCheck check(impl, "allReduce");
  check.type(type);
  check.op(op);
  check.size("count", count, type);
  check.buffer("send", send, count);
  check.buffer("recv", recv, count);
  const bool onDevice = check.onDevice(stream, {{"send", send}, {"recv", recv}});
  PendingOp pending =
      collectiveOp(impl, Collective::AllReduce, "allReduce", shapeFor(impl, count, type, onDevice),
                   type, send, recv, stream, onDevice);
  pending.info.op = op;
  pending.info.reduces = true;
  return impl.issue(std::move(pending));
}

Work Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "broadcast");
  ArgumentCheck check(impl, "broadcast");
  check.type(type);
  check.rank("root", root);
  check.size("count", count, type);
  if (impl.rank == root) check.buffer("send", send, count);
  check.buffer("recv", recv, count);
  const bool onDevice =
      check.onDevice(stream, {{"send", impl.rank == root ? send : nullptr}, {"recv", recv}});
  algo::Shape shape = shapeFor(impl, count, type, onDevice);
  shape.root = root;
  PendingOp pending = collectiveOp(impl, Collective::Broadcast, "broadcast", shape, type, send,
                                   recv, stream, onDevice);
  pending.info.root = root;
  return impl.issue(std::move(pending));
}

Work Communicator::reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                          int root, Stream stream) {
  Impl& impl = usable(impl_.get(), "reduce");
  ArgumentCheck check(impl, "reduce");
  check.type(type);
  check.op(op);
  check.rank("root", root);
  check.size("count", count, type);
  check.buffer("send", send, count);
  if (impl.rank == root) check.buffer("recv", recv, count);
  const bool onDevice =
      check.onDevice(stream, {{"send", send}, {"recv", impl.rank == root ? recv : nullptr}});
  algo::Shape shape = shapeFor(impl, count, type, onDevice);
  shape.root = root;
  PendingOp pending =
      collectiveOp(impl, Collective::Reduce, "reduce", shape, type, send, recv, stream, onDevice);
  pending.info.op = op;
  pending.info.reduces = true;
  pending.info.root = root;
  return impl.issue(std::move(pending));
}

Work Communicator::allGather(const void* send, void* recv, size_t sendCount, DataType type,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "allGather");
  ArgumentCheck check(impl, "allGather");
  check.type(type);
  check.size("sendCount", sendCount, type, impl.nranks);
  check.buffer("send", send, sendCount);
  check.buffer("recv", recv, sendCount);
  const bool onDevice = check.onDevice(stream, {{"send", send}, {"recv", recv}});
  return impl.issue(collectiveOp(impl, Collective::AllGather, "allGather",
                                 shapeFor(impl, sendCount, type, onDevice), type, send, recv,
                                 stream, onDevice));
}

Work Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, DataType type,
                                 ReduceOp op, Stream stream) {
  Impl& impl = usable(impl_.get(), "reduceScatter");
  ArgumentCheck check(impl, "reduceScatter");
  check.type(type);
  check.op(op);
  check.size("recvCount", recvCount, type, impl.nranks);
  check.buffer("send", send, recvCount);
  check.buffer("recv", recv, recvCount);
  const bool onDevice = check.onDevice(stream, {{"send", send}, {"recv", recv}});
  PendingOp pending =
      collectiveOp(impl, Collective::ReduceScatter, "reduceScatter",
                   shapeFor(impl, recvCount, type, onDevice), type, send, recv, stream, onDevice);
  pending.info.op = op;
  pending.info.reduces = true;
  return impl.issue(std::move(pending));
}

namespace {

PendingOp pointToPointOp(Communicator::Impl& impl, bool sending, const void* input, void* output,
                         size_t count, DataType type, int peer, Stream stream, bool onDevice) {
  algo::Shape shape = shapeFor(impl, count, type, onDevice);
  shape.peer = peer;
  uint64_t& seq = sending ? impl.sendSeq[peer] : impl.recvSeq[peer];
  PendingOp op;
  op.info.name = sending ? "send" : "recv";
  op.info.seq = seq++;
  op.info.count = count;
  op.info.type = type;
  op.info.peer = peer;
  op.kind = sending ? Collective::Send : Collective::Recv;
  op.shape = shape;
  op.input = input;
  op.output = output;
  // The k-th send from A to B meets the k-th receive at B from A.
  placeOn(op, onDevice, stream);
  return op;
}

}  // namespace

namespace {

// send() and recv(): the same checks, then the op. A send reads `input`,
// a receive writes `output`; the other is null.
Work issuePointToPoint(Communicator::Impl* handle, bool sending, const void* input, void* output,
                       size_t count, DataType type, int peer, Stream stream) {
  const char* call = sending ? "send" : "recv";
  const void* buffer = sending ? input : output;
  Communicator::Impl& impl = usable(handle, call);
  ArgumentCheck check(impl, call);
  check.type(type);
  check.rank("peer", peer);
  check.size("count", count, type);
  check.buffer("buffer", buffer, count);
  const bool onDevice = check.onDevice(stream, {{"buffer", buffer}});
  return impl.issue(
      pointToPointOp(impl, sending, input, output, count, type, peer, stream, onDevice));
}

}  // namespace

Work Communicator::send(const void* buffer, size_t count, DataType type, int peer, Stream stream) {
  return issuePointToPoint(impl_.get(), true, buffer, nullptr, count, type, peer, stream);
}

Work Communicator::recv(void* buffer, size_t count, DataType type, int peer, Stream stream) {
  return issuePointToPoint(impl_.get(), false, nullptr, buffer, count, type, peer, stream);
}

int Communicator::recvFromAny(void* buffer, size_t count, DataType type) {
  Impl& impl = usable(impl_.get(), "recvFromAny");
  ArgumentCheck check(impl, "recvFromAny");
  check.type(type);
  check.size("count", count, type);
  if (count == 0)
    check.reject("argument 'count' is 0: a receive from any source needs a message to match");
  check.buffer("buffer", buffer, count);
  if (impl.device && impl.device->deviceOf(buffer) >= 0)
    check.reject("argument 'buffer' is device memory: a receive from any source takes host memory");
  if (impl.groupDepth > 0)
    fail(ErrorCode::InvalidUsage, impl.rank,
         "recvFromAny: a receive from any source cannot be part of a group (call it before "
         "groupStart() or after groupEnd())");
  if (impl.nranks == 1)
    fail(ErrorCode::InvalidUsage, impl.rank,
         "recvFromAny: this communicator has no other rank to receive from");
  const int peer = impl.awaitSender(count, type);
  PendingOp op = pointToPointOp(impl, false, nullptr, buffer, count, type, peer, Stream(), false);
  op.info.name = "recvFromAny";
  impl.issue(std::move(op));  // inline: it completed, or it threw
  return peer;
}

Work Communicator::barrier(Stream stream) {
  Impl& impl = usable(impl_.get(), "barrier");
  PendingOp pending =
      collectiveOp(impl, Collective::AllReduce, "barrier", shapeFor(impl, 1, DataType::Uint8),
                   DataType::Uint8, &impl.barrierIn, &impl.barrierOut, stream, false);
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
  } catch (const Error& error) {
    impl.dropGroup(error);  // no Work may wait forever
    throw;
  }
  std::vector<PendingOp> ops = std::move(impl.group);
  impl.group.clear();
  try {
    for (PendingOp& op : ops) impl.resolvePlan(op, true);
  } catch (const Error& error) {
    impl.group = std::move(ops);
    impl.dropGroup(error);
    throw;
  }
  for (PendingOp& op : ops) {
    std::lock_guard<std::mutex> lock(op.work->mutex);
    op.work->inOpenGroup = false;
  }
  // Device ops are enqueued together on their streams; the host ops run
  // as a group of their own.
  auto firstHost = std::stable_partition(ops.begin(), ops.end(),
                                         [](const PendingOp& op) { return op.onDevice; });
  if (firstHost != ops.begin()) {
    try {
      impl.executeOnDevice(ops.data(), static_cast<size_t>(firstHost - ops.begin()));
    } catch (const Error& error) {
      impl.group.assign(std::make_move_iterator(firstHost), std::make_move_iterator(ops.end()));
      impl.dropGroup(error);
      throw;
    }
    ops.erase(ops.begin(), firstHost);
    if (ops.empty()) return;
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
  net::Deadline deadline = deadlineAfter(impl.timeout());

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
  Knobs knobs = impl.knobs;
  knobs.timeout = impl.timeout();  // as setTimeout() left it
  return Communicator(std::make_unique<Impl>(std::move(boot), knobs));
}

UniqueId Communicator::growId() {
  Impl& impl = usable(impl_.get(), "growId");
  net::Address at = impl.bootstrap->listenAddress();
  at.setPort(0);
  net::Listener listener(at);
  bootstrap::IdContents contents{listener.address(), randomSecret()};
  bootstrap::startRoot(std::move(listener), contents.secret, impl.timeout());
  return bootstrap::encodeId(contents);
}

Communicator Communicator::grow(int nranks, const UniqueId* id) {
  Impl& impl = usable(impl_.get(), "grow");
  if (impl.groupDepth > 0) fail(ErrorCode::InvalidUsage, impl.rank, "grow inside a group");
  impl.waitForAsyncIdle();
  const net::Deadline deadline = deadlineAfter(impl.timeout());
  struct Offer {
    int32_t nranks;
    uint32_t hasId;
    UniqueId id;
  };
  std::vector<Offer> offers(static_cast<size_t>(impl.nranks));
  Offer& mine = offers[impl.rank];
  mine.nranks = nranks;
  mine.hasId = id ? 1 : 0;
  if (id) mine.id = *id;
  try {
    impl.bootstrap->allGather(offers.data(), sizeof(Offer), deadline);
  } catch (const Error& error) {
    impl.recordFailure(error);
    throw;
  }
  std::vector<int> withId;
  for (int r = 0; r < impl.nranks; ++r) {
    if (offers[r].nranks != nranks)
      fail(ErrorCode::InvalidArgument, impl.rank,
           format("grow: argument 'nranks' is %d here and %d on rank %d: every member passes "
                  "the same",
                  nranks, offers[r].nranks, r));
    if (offers[r].hasId) withId.push_back(r);
  }
  if (nranks <= impl.nranks)
    fail(ErrorCode::InvalidArgument, impl.rank,
         format("grow: argument 'nranks' is %d: a communicator of %d grows to more", nranks,
                impl.nranks));
  if (withId.size() != 1)
    fail(ErrorCode::InvalidArgument, impl.rank,
         format("grow: argument 'id' was passed by %zu members%s: exactly one member passes "
                "the id it made with growId()",
                withId.size(),
                withId.empty() ? "" : (" (ranks " + listOfRanks(withId) + ")").c_str()));
  const UniqueId& grown = offers[withId[0]].id;
  net::Address at = impl.bootstrap->listenAddress();
  at.setPort(0);
  auto boot = bootstrap::Bootstrap::join(grown, nranks, impl.rank, at, deadline);
  Knobs knobs = impl.knobs;
  knobs.timeout = impl.timeout();
  BRAID_INFO(Init, "grow: rank %d of %d is rank %d of %d", impl.rank, impl.nranks, impl.rank,
             nranks);
  return Communicator(std::make_unique<Impl>(std::move(boot), knobs));
}

void Communicator::abort() {
  if (!impl_) return;
  impl_->recordFailure(Error(ErrorCode::Aborted,
                             format("braid rank %d: the communicator was aborted", impl_->rank)));
  impl_->aborted.store(true);
}

void Communicator::revoke() {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: revoke() on an empty communicator handle");
  impl_->revoke();
}

void Communicator::setTimeout(std::chrono::milliseconds timeout) {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: setTimeout() on an empty communicator handle");
  if (timeout.count() <= 0)
    fail(ErrorCode::InvalidArgument, impl_->rank,
         format("setTimeout: argument 'timeout' is %lld ms; it must be positive",
                static_cast<long long>(timeout.count())));
  impl_->timeoutMs.store(std::min(timeout, kLongestTimeout).count(), std::memory_order_relaxed);
}

std::chrono::milliseconds Communicator::timeout() const {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: timeout() on an empty communicator handle");
  return impl_->timeout();
}

int Communicator::rank() const {
  if (!impl_) throw Error(ErrorCode::InvalidUsage, "braid: rank() on an empty communicator handle");
  return impl_->rank;
}
int Communicator::size() const {
  if (!impl_) throw Error(ErrorCode::InvalidUsage, "braid: size() on an empty communicator handle");
  return impl_->nranks;
}
int Communicator::device() const {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: device() on an empty communicator handle");
  return impl_->device ? impl_->deviceIndex : -1;
}

}  // namespace braid
