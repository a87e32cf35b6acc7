#include "braid/communicator.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <random>
#include <thread>

#include "core/calibrate.h"
#include "core/communicator_impl.h"
#include "core/diagnose.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "core/log.h"
#include "core/memory.h"

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

// Ranks per host when ranks are numbered host by host with the same count
// on every host (Shape::localRanks), else 0.
int ranksPerHostInOrder(const bootstrap::Bootstrap& bootstrap) {
  const auto& table = bootstrap.table();
  const int n = static_cast<int>(table.size());
  int perHost = 1;
  while (perHost < n && table[perHost].hostId == table[0].hostId) ++perHost;
  if (n % perHost != 0) return 0;
  for (int r = 0; r < n; ++r) {
    const int first = r / perHost * perHost;
    if (table[r].hostId != table[first].hostId) return 0;  // a host split in two
    if (r == first && r > 0) {
      for (int earlier = 0; earlier < first; earlier += perHost)
        if (table[earlier].hostId == table[r].hostId) return 0;  // a host seen before
    }
  }
  return perHost;
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
    uint64_t slotBytes, slots, sockets, chunkBytes, oneShotBytes, algo, tuning, deterministic;
    uint64_t deviceSlotBytes, deviceSlots, deviceGraphs;
    char transports[48];
  };
  std::vector<Shared> all(bootstrap.size());
  Shared& mine = all[bootstrap.rank()];
  std::memset(&mine, 0, sizeof(mine));
  mine.slotBytes = knobs.slotBytes;
  mine.slots = static_cast<uint64_t>(knobs.slots);
  mine.sockets = static_cast<uint64_t>(knobs.sockets);
  mine.chunkBytes = knobs.chunkBytes;
  mine.oneShotBytes = knobs.oneShotBytes;
  mine.tuning = static_cast<uint64_t>(knobs.tuning);
  mine.deterministic = knobs.deterministic ? 1 : 0;
  mine.deviceSlotBytes = knobs.deviceSlotBytes;
  mine.deviceSlots = static_cast<uint64_t>(knobs.deviceSlots);
  mine.deviceGraphs = knobs.deviceGraphs ? 1 : 0;
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
    if (theirs.sockets != mine.sockets)
      differ("BRAID_NSOCKS_PERTHREAD", std::to_string(mine.sockets),
             std::to_string(theirs.sockets));
    if (theirs.chunkBytes != mine.chunkBytes)
      differ("BRAID_CHUNK_BYTES (Config::chunkBytes)", std::to_string(mine.chunkBytes),
             std::to_string(theirs.chunkBytes));
    if (theirs.deviceSlotBytes != mine.deviceSlotBytes)
      differ("BRAID_DEVICE_SLOT_BYTES", std::to_string(mine.deviceSlotBytes),
             std::to_string(theirs.deviceSlotBytes));
    if (theirs.deviceSlots != mine.deviceSlots)
      differ("BRAID_DEVICE_SLOTS", std::to_string(mine.deviceSlots),
             std::to_string(theirs.deviceSlots));
    if (theirs.deviceGraphs != mine.deviceGraphs)
      differ("BRAID_DEVICE_GRAPHS", std::to_string(mine.deviceGraphs),
             std::to_string(theirs.deviceGraphs));
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
  // Whether the op's buffers (those this rank uses; null ones are skipped)
  // are memory of the communicator's device, so that it runs on the device
  // executor. All host, or all this device's, and a device stream with
  // device memory; else InvalidArgument naming the argument.
  struct Named {
    const char* name;
    const void* pointer;
  };
  bool onDevice(const Stream& stream, std::initializer_list<Named> buffers) const {
    if (!impl_.device) return false;  // every pointer is host memory
    const Named* first = nullptr;
    int firstDevice = -1;
    for (const Named& buffer : buffers) {
      if (!buffer.pointer) continue;
      const int device = impl_.device->deviceOf(buffer.pointer);
      if (device >= 0 && device != impl_.deviceIndex)
        reject(format("argument '%s' is memory of device %d; this communicator's device is %d",
                      buffer.name, device, impl_.deviceIndex));
      if (!first) {
        first = &buffer;
        firstDevice = device;
      } else if ((device >= 0) != (firstDevice >= 0)) {
        reject(
            format("argument '%s' is %s memory and '%s' %s memory: both must be host memory "
                   "or both device memory",
                   first->name, firstDevice >= 0 ? "device" : "host", buffer.name,
                   device >= 0 ? "device" : "host"));
      }
    }
    if (firstDevice < 0) return false;
    if (!stream.isDevice())
      reject(
          format("argument 'stream': '%s' is device memory, which needs Stream::cuda(stream) "
                 "(the host streams cannot order device work)",
                 first->name));
    if (!impl_.deviceExecutor)
      fail(ErrorCode::InvalidUsage, impl_.rank,
           format("%s: device buffers cannot be used by this communicator: %s", op_,
                  impl_.noDevice.c_str()));
    return true;
  }

 private:
  const Communicator::Impl& impl_;
  const char* op_;
};

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
    algo::Shape& onDevice = deviceShapes[static_cast<size_t>(t)];
    onDevice = shape;
    onDevice.alignElems = std::max<size_t>(1, 256 / size);  // chunks start on 256-byte lines
    onDevice.chunkElems =
        std::max(onDevice.alignElems,
                 knobs.deviceChunkBytes / size / onDevice.alignElems * onDevice.alignElems);
  }
  // The hierarchical algorithms need the host layout; deterministic
  // results may not depend on it.
  const int perHost = knobs.deterministic ? 0 : ranksPerHostInOrder(*bootstrap);
  for (algo::Shape& shape : shapes) shape.localRanks = perHost;
  devicePlans.useModel(transport::linkModels(0).device);
  checkKnobsAgree(*bootstrap, knobs, deadlineAfter(knobs.timeout));
  wiring = transport::wireUp(
      {*bootstrap, knobs, knobs.slotBytes, knobs.slots, deadlineAfter(knobs.timeout)});
  executor = std::make_unique<exec::Executor>(
      wiring, rank, knobs.slotBytes, localRanks(*bootstrap) <= usableCores(), knobs.directBytes);
  setUpDevice();
  if (knobs.tuning != Tuning::Fixed) {
    // Every rank must choose alike, so all model the same links. Without a
    // measurement that is the slowest transport any rank uses (tcp if any
    // pair talks over it); a measurement is taken where every pair talks
    // over one kind of transport (else it would time only some of them).
    std::vector<uint32_t> rows(static_cast<size_t>(nranks), 0);
    rows[rank] = transport::rowsUsed(wiring);
    bootstrap->allGather(rows.data(), sizeof(uint32_t), deadlineAfter(knobs.timeout));
    uint32_t used = 0;
    for (uint32_t r : rows) used |= r;
    const transport::LinkModels models = transport::linkModels(used);
    algo::LinkModel link = models.host;
    if (!knobs.deterministic) devicePlans.useModel(models.device);
    if (knobs.deterministic)
      link = transport::linkModels(0).host;  // the same choice over every transport
    else if (knobs.tuning == Tuning::Measured && nranks > 1 && !models.mixed)
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
  deviceExecutor.reset();  // waits for the device work in flight
  if (!group.empty())
    dropGroup(Error(ErrorCode::Aborted,
                    format("braid rank %d: the communicator was destroyed inside a group", rank)));
  {
    std::lock_guard<std::mutex> lock(queueMutex);
    stopping = true;
  }
  queueChanged.notify_all();
  if (progressThread.joinable()) progressThread.join();
}

void Communicator::Impl::setUpDevice() {
  device = device::current();
  // Every rank or none: a rank without a device keeps the others from
  // setting up connections nobody could use.
  deviceIndex = device ? (knobs.device >= 0 ? knobs.device : device->current()) : -1;
  const bool usable = device && deviceIndex < device->count();
  std::vector<uint8_t> ready(static_cast<size_t>(nranks), 0);
  ready[rank] = usable ? 1 : 0;
  bootstrap->allGather(ready.data(), 1, deadlineAfter(knobs.timeout));
  if (device && !usable)
    fail(ErrorCode::InvalidArgument, rank,
         format("init: Config::device is %d, and this process has %d %s devices (0 to %d)",
                deviceIndex, device->count(), device->name(), device->count() - 1));
  for (int r = 0; r < nranks; ++r)
    if (!ready[r] && noDevice.empty())
      noDevice = r == rank ? device::unavailableReason()
                           : format("rank %d of this communicator has no device", r);
  if (!noDevice.empty()) return;
  const transport::Setup setup{*bootstrap,
                               knobs,
                               knobs.deviceSlotBytes,
                               knobs.deviceSlots,
                               deadlineAfter(knobs.timeout),
                               device,
                               deviceIndex};
  std::unique_ptr<transport::DeviceTransport> connections;
  try {
    connections = transport::wireDevice(setup, wiring);
  } catch (const Error& error) {
    // Every rank throws alike: the communicator goes on for host buffers.
    if (error.code() == ErrorCode::Timeout) throw;
    noDevice = error.what();
    BRAID_WARN(Init, "device buffers cannot be used: %s", error.what());
    return;
  }
  // "3 over cuda_ipc, 1 over tcp": the ranks each way of reaching them
  // (a path's first word) takes, this rank included.
  std::vector<std::pair<std::string, int>> ways;
  for (int peer = 0; peer < nranks; ++peer) {
    const std::string path = connections->path(peer);
    const std::string way = path.substr(0, path.find(':'));
    auto known =
        std::find_if(ways.begin(), ways.end(), [&](const auto& w) { return w.first == way; });
    if (known == ways.end())
      ways.emplace_back(way, 1);
    else
      ++known->second;
  }
  std::string reach;
  for (const auto& [way, count] : ways)
    reach += format("%s%d over %s", reach.empty() ? "" : ", ", count, way.c_str());
  deviceExecutor = std::make_unique<exec::DeviceExecutor>(
      *device, std::move(connections), rank, nranks, deviceIndex, knobs.timeout, aborted,
      [this](const Error& error) { recordFailure(error); });
  // The FIFOs of ops captured into CUDA graphs, made now, with every rank
  // (at a capture some ranks may capture nothing).
  if (!knobs.deviceGraphs) {
    noGraphs = "BRAID_DEVICE_GRAPHS is 0";
  } else {
    try {
      deviceExecutor->setGraphFifos(transport::wireGraphDevice(setup, wiring));
    } catch (const Error& error) {  // every rank throws alike; only capture is lost
      if (error.code() == ErrorCode::Timeout) throw;
      noGraphs = error.what();
      BRAID_WARN(Init, "ops on device buffers cannot be captured into CUDA graphs: %s",
                 error.what());
    }
  }
  BRAID_INFO(Init, "device %d (%s): device buffers reach %d ranks: %s", deviceIndex, device->name(),
             nranks, reach.c_str());
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

void Communicator::Impl::dropGroup(const Error& error) {
  for (PendingOp& op : group) {
    {
      std::lock_guard<std::mutex> lock(op.work->mutex);
      op.work->inOpenGroup = false;
    }
    op.work->complete(&error);
  }
  group.clear();
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

Communicator::Impl& usable(Communicator::Impl* impl, const char* op) {
  if (!impl)
    throw Error(ErrorCode::InvalidUsage,
                format("braid: %s on an empty communicator handle (moved from, or split with a "
                       "negative color)",
                       op));
  impl->throwIfFailed();
  return *impl;
}

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

PendingOp collectiveOp(Communicator::Impl& impl, Collective collective, const char* name,
                       const algo::Shape& shape, DataType type, const void* input, void* output,
                       Stream stream, bool onDevice) {
  PendingOp op;
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

// ---------------------------------------------------------------- windows

RegisteredWindow& RegisteredWindow::operator=(RegisteredWindow&& other) noexcept {
  if (this != &other) {
    std::swap(id_, other.id_);
    std::swap(base_, other.base_);
    std::swap(bytes_, other.bytes_);
    std::swap(ranks_, other.ranks_);
    std::swap(device_, other.device_);
  }
  return *this;
}

RegisteredWindow::~RegisteredWindow() {
  if (!device_) return;
  try {
    transport::unmapWindow(*device_, ranks_, bytes_);
  } catch (const Error& error) {  // a broken device: nothing more to do about it
    BRAID_WARN(Exec, "unmapping window %llu failed: %s", static_cast<unsigned long long>(id_),
               error.what());
  }
}

std::byte* RegisteredWindow::at(int r, const void* pointer, size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(pointer);
  if (p < base_ || p > base_ + bytes_ || bytes > static_cast<size_t>(base_ + bytes_ - p))
    return nullptr;
  std::byte* theirs = ranks_[static_cast<size_t>(r)].base;
  return theirs ? theirs + (p - base_) : nullptr;
}

bool RegisteredWindow::reachesEveryRank() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const transport::PeerWindow& w) { return w.base != nullptr; });
}

void Communicator::Impl::mapBuffers(PendingOp& op) const {
  // Only these collectives have direct plans.
  if (windows.empty() || nranks > algo::kMaxDirectRanks ||
      (op.kind != Collective::AllReduce && op.kind != Collective::AllGather &&
       op.kind != Collective::Broadcast))
    return;
  const size_t bytes = op.shape.count * dataTypeSize(op.info.type);
  if (bytes == 0) return;
  // The buffers the direct plans reach into: every rank's input and
  // output for all-reduce, the output for all-gather and broadcast.
  const bool inputs = op.kind == Collective::AllReduce;
  const size_t outBytes = op.kind == Collective::AllGather ? bytes * nranks : bytes;
  auto windowOf = [&](const void* pointer, size_t length) -> const RegisteredWindow* {
    for (const RegisteredWindow& w : windows)
      if (w.reachesEveryRank() && w.at(rank, pointer, length)) return &w;
    return nullptr;
  };
  const RegisteredWindow* in = inputs ? windowOf(op.input, bytes) : nullptr;
  const RegisteredWindow* out = windowOf(op.output, outBytes);
  if (!out || (inputs && !in)) return;
  op.shape.mapped = true;
  op.peerOutputs.resize(static_cast<size_t>(nranks));
  if (inputs) op.peerInputs.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    op.peerOutputs[r] = out->at(r, op.output, outBytes);
    if (inputs) op.peerInputs[r] = in->at(r, op.input, bytes);
  }
}

namespace {

// Collective (one bootstrap all-gather): each rank's verdict on its own
// arguments of `call` ("" when fine). When any rank's are bad, every rank
// throws Error(InvalidArgument) with the first such rank's reason, so no
// rank waits for the others in a collective they never enter.
void agreeOnArguments(Communicator::Impl& impl, const char* call, const std::string& problem) {
  struct Verdict {
    char what[240];  // "" when fine
  };
  std::vector<Verdict> all(static_cast<size_t>(impl.nranks));
  std::snprintf(all[impl.rank].what, sizeof(Verdict::what), "%s", problem.c_str());
  impl.bootstrap->allGather(all.data(), sizeof(Verdict), deadlineAfter(impl.knobs.timeout));
  for (int r = 0; r < impl.nranks; ++r) {
    Verdict& verdict = all[r];
    verdict.what[sizeof(verdict.what) - 1] = '\0';
    if (verdict.what[0] == '\0') continue;
    if (r == impl.rank)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid rank %d: %s: %s", impl.rank, call, verdict.what));
    throw Error(ErrorCode::InvalidArgument, format("braid rank %d: %s: rank %d's call is wrong: %s",
                                                   impl.rank, call, r, verdict.what));
  }
}

}  // namespace

Window Communicator::registerWindow(void* buffer, size_t bytes) {
  Impl& impl = usable(impl_.get(), "registerWindow");
  const char* what = "registerWindow";
  // (Every rank or none has a device: these fail alike everywhere.)
  if (!impl.device)
    throw Error(ErrorCode::InvalidUsage, format("braid rank %d: %s: %s", impl.rank, what,
                                                device::unavailableReason().c_str()));
  if (!impl.deviceExecutor)
    throw Error(ErrorCode::InvalidUsage,
                format("braid rank %d: %s: device buffers cannot be used: %s", impl.rank, what,
                       impl.noDevice.c_str()));
  std::string problem;
  const int holder = buffer ? impl.device->deviceOf(buffer) : -1;
  if (!buffer)
    problem = "argument 'buffer' is NULL";
  else if (bytes == 0)
    problem = "argument 'bytes' is 0";
  else if (holder != impl.deviceIndex)
    problem = format("argument 'buffer' is %s, not memory of this communicator's device %d",
                     holder < 0 ? "host memory" : format("memory of device %d", holder).c_str(),
                     impl.deviceIndex);
  impl.waitForAsyncIdle();
  agreeOnArguments(impl, what, problem);
  const transport::Setup setup{*impl.bootstrap,
                               impl.knobs,
                               impl.knobs.deviceSlotBytes,
                               impl.knobs.deviceSlots,
                               deadlineAfter(impl.knobs.timeout),
                               impl.device,
                               impl.deviceIndex};
  std::vector<transport::PeerWindow> ranks;
  try {
    ranks = transport::mapWindow(setup, impl.wiring, buffer, bytes);
  } catch (const Error& error) {
    // Every rank throws alike; an argument error leaves the communicator as it was.
    if (error.code() == ErrorCode::Timeout) impl.recordFailure(error);
    throw Error(error.code(), format("braid rank %d: %s: %s", impl.rank, what, error.what()));
  }
  const uint64_t id = impl.nextWindow++;
  impl.windows.emplace_back(id, static_cast<std::byte*>(buffer), bytes, std::move(ranks),
                            *impl.device);
  return Window{id};
}

void Communicator::deregisterWindow(Window window) {
  Impl& impl = usable(impl_.get(), "deregisterWindow");
  auto found = std::find_if(impl.windows.begin(), impl.windows.end(),
                            [&](const RegisteredWindow& w) { return w.id() == window.id; });
  // Every op that may reach into a window runs before the peers unmap it;
  // the agreement after it is also the barrier behind every rank's ops.
  impl.waitForAsyncIdle();
  if (impl.deviceExecutor) impl.deviceExecutor->waitIdle();
  agreeOnArguments(impl, "deregisterWindow",
                   found != impl.windows.end()
                       ? ""
                       : format("window %llu was not registered with this communicator (or was "
                                "deregistered already)",
                                static_cast<unsigned long long>(window.id)));
  impl.windows.erase(found);
}

Work Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             Stream stream) {
  Impl& impl = usable(impl_.get(), "allReduce");
  Checker check(impl, "allReduce");
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
  Checker check(impl, "broadcast");
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
  Checker check(impl, "reduce");
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
  Checker check(impl, "allGather");
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
  Checker check(impl, "reduceScatter");
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

Work Communicator::send(const void* buffer, size_t count, DataType type, int peer, Stream stream) {
  Impl& impl = usable(impl_.get(), "send");
  Checker check(impl, "send");
  check.type(type);
  check.rank("peer", peer);
  check.size("count", count, type);
  check.buffer("buffer", buffer, count);
  const bool onDevice = check.onDevice(stream, {{"buffer", buffer}});
  return impl.issue(
      pointToPointOp(impl, true, buffer, nullptr, count, type, peer, stream, onDevice));
}

Work Communicator::recv(void* buffer, size_t count, DataType type, int peer, Stream stream) {
  Impl& impl = usable(impl_.get(), "recv");
  Checker check(impl, "recv");
  check.type(type);
  check.rank("peer", peer);
  check.size("count", count, type);
  check.buffer("buffer", buffer, count);
  const bool onDevice = check.onDevice(stream, {{"buffer", buffer}});
  return impl.issue(
      pointToPointOp(impl, false, nullptr, buffer, count, type, peer, stream, onDevice));
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
int Communicator::device() const {
  if (!impl_)
    throw Error(ErrorCode::InvalidUsage, "braid: device() on an empty communicator handle");
  return impl_->device ? impl_->deviceIndex : -1;
}

namespace detail {

std::vector<std::string> peerTransports(const Communicator& comm) {
  if (!comm.impl()) return {};
  std::vector<std::string> names;
  for (const transport::TransportEntry* entry : comm.impl()->wiring.entries)
    names.push_back(entry->name);
  return names;
}

std::vector<uint64_t> stripePosts(const Communicator& comm, int peer) {
  if (!comm.impl() || peer < 0 || peer >= comm.size()) return {};
  return comm.impl()->wiring.connections[peer]->stripePosts();
}

std::vector<std::string> peerDevicePaths(const Communicator& comm) {
  const Communicator::Impl* impl = comm.impl();
  if (!impl || !impl->device) return {};
  std::vector<std::string> paths;
  for (int peer = 0; peer < impl->nranks; ++peer) {
    if (!impl->deviceExecutor) {
      paths.push_back("none");
      continue;
    }
    const transport::DeviceTransport& transport = impl->deviceExecutor->transport();
    paths.push_back(transport.path(peer));
  }
  return paths;
}

std::vector<std::string> builtTransports() { return transport::builtTransports(); }
std::string transportStatus(const std::string& name) {
  const transport::TransportEntry* entry = transport::find(name);
  if (!entry) return format("no transport is named '%s'", name.c_str());
  if (!entry->notBuilt.empty()) return "not built (" + entry->notBuilt + ")";
  try {
    return entry->unusableHere ? entry->unusableHere() : "";
  } catch (const Error& error) {
    return error.what();
  }
}

std::string lastAlgorithm(const Communicator& comm) {
  return comm.impl() ? algo::algorithmName(comm.impl()->plans.lastAlgorithm()) : "";
}

std::string lastDeviceAlgorithm(const Communicator& comm) {
  return comm.impl() ? algo::algorithmName(comm.impl()->devicePlans.lastAlgorithm()) : "";
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
