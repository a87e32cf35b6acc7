// The communicator's state: its creation (connections, device, tuning
// model), its failure state and its end. The calls that use it are in
// communicator.cc (the API), pipeline.cc (running ops) and windows.cc.
#include "core/communicator_impl.h"

#include <sched.h>

#include <algorithm>

#include "core/calibrate.h"
#include "core/device_one_sided.h"
#include "core/diagnose.h"
#include "core/errors.h"
#include "core/knob_agreement.h"
#include "core/log.h"
#include "core/one_sided.h"

namespace braid {
namespace {

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

}  // namespace

Communicator::Impl::Impl(std::unique_ptr<bootstrap::Bootstrap> boot, const Knobs& k,
                         const Lineage* lineage)
    : rank(boot->rank()),
      nranks(boot->size()),
      knobs(k),
      bootstrap(std::move(boot)),
      timeoutMs(k.timeout.count()),
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
  // (A shrunk communicator has its parent's knobs, which they agreed on.)
  if (!lineage) checkKnobsAgree(*bootstrap, knobs, deadlineAfter(knobs.timeout));
  transport::Setup setup{*bootstrap, knobs, knobs.slotBytes, knobs.slots,
                         deadlineAfter(knobs.timeout)};
  std::optional<transport::Parent> parent;
  if (lineage) {
    parent.emplace(transport::Parent{lineage->parent.wiring, lineage->ranks,
                                     lineage->parent.failed.load(std::memory_order_acquire)});
    setup.parent = &*parent;
  }
  wiring = transport::wireUp(setup);
  executor = std::make_unique<exec::Executor>(wiring, rank, knobs.slotBytes,
                                              localRanks(*bootstrap) <= usableCores(),
                                              knobs.directBytes, revoked);
  // Pieces by address: from BRAID_CMA_BYTES, or from the size at which the
  // measurement below saw them win (none without one).
  const bool measureAddresses = knobs.addressBytes == kMeasuredAddressBytes;
  executor->sendByAddressFrom(measureAddresses ? 0 : knobs.addressBytes);
  setUpDevice(lineage);
  if (knobs.tuning != Tuning::Fixed) {
    // Every rank must choose alike, so all model the same links. Without a
    // measurement that is the slowest transport any rank uses (tcp if any
    // pair talks over it); a measurement is taken where every pair talks
    // over one kind of transport (else it would time only some of them).
    const uint32_t used = transport::rowsUsed(wiring, *bootstrap);
    const transport::LinkModels models = transport::linkModels(used);
    algo::LinkModel link = models.host;
    if (!knobs.deterministic) devicePlans.useModel(models.device);
    if (knobs.deterministic)
      link = transport::linkModels(0).host;  // the same choice over every transport
    else if (knobs.tuning == Tuning::Measured && nranks > 1 && !models.mixed) {
      // (`used` is the same on every rank, so all inherit or all measure.)
      const std::optional<MeasuredLink> inherited =
          lineage ? lineage->parent.measuredLink : std::nullopt;
      size_t addressFrom = 0;
      const bool addresses = measureAddresses && models.byAddress;
      if (inherited && inherited->rows == used) {
        link = inherited->link;
        addressFrom = inherited->addressFrom;
        if (addresses) executor->sendByAddressFrom(addressFrom);
      } else {
        link = calibrateLink(*executor, *bootstrap, wiring, knobs.timeout, aborted, link,
                             addresses ? &addressFrom : nullptr);
      }
      measuredLink = MeasuredLink{used, link, addressFrom};
      if (addresses) copyChoice.emplace(executor->carriesAddresses(), addressFrom);
    }
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
  // Device ops may wait for what the device windows' proxy sends: it stops
  // once they are done, before the executor goes.
  if (deviceSignals) {
    if (deviceExecutor) deviceExecutor->waitIdle();
    deviceSignals->stopProxy();
  }
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
  // A failure no host op saw (the device path's) still reaches the peers
  // over the host connections, naming whom it blames, rather than a
  // goodbye that reads as a clean leave.
  if (failed.load(std::memory_order_acquire) && !gaveUp) giveUp(-1);
}

transport::Setup Communicator::Impl::deviceSetup() const {
  const transport::Setup setup{
      *bootstrap, knobs,      knobs.deviceSlotBytes, knobs.deviceSlots, deadlineAfter(timeout()),
      device,     deviceIndex};
  return setup;
}

void Communicator::Impl::setUpDevice(const Lineage* lineage) {
  device = device::current();
  // Every rank or none: a rank without a device keeps the others from
  // setting up connections nobody could use.
  deviceIndex = device ? (knobs.device >= 0 ? knobs.device : device->current()) : -1;
  const bool usable = device && deviceIndex < device->count();
  std::vector<uint8_t>& ready = deviceReady;
  ready.assign(static_cast<size_t>(nranks), 0);
  if (lineage) {  // the parent's processes, with its knobs: as they were there
    for (int r = 0; r < nranks; ++r) ready[r] = lineage->parent.deviceReady[lineage->ranks[r]];
  } else {
    ready[rank] = usable ? 1 : 0;
    bootstrap->allGather(ready.data(), 1, deadlineAfter(knobs.timeout));
  }
  if (device && !usable)
    fail(ErrorCode::InvalidArgument, rank,
         format("init: Config::device is %d, and this process has %d %s devices (0 to %d)",
                deviceIndex, device->count(), device->name(), device->count() - 1));
  for (int r = 0; r < nranks; ++r)
    if (!ready[r] && noDevice.empty())
      noDevice = r == rank ? device::unavailableReason()
                           : format("rank %d of this communicator has no device", r);
  if (!noDevice.empty()) return;
  const transport::Setup setup = deviceSetup();
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
      *device, std::move(connections), rank, nranks, deviceIndex, timeoutMs, aborted, revoked,
      [this](const Error& error, int blamed, transport::GiveUpReason reason) {
        recordFailure(error, blamed, reason);
      });
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

void Communicator::Impl::recordFailure(const Error& error, int blamed,
                                       transport::GiveUpReason reason) {
  std::lock_guard<std::mutex> lock(failureMutex);
  if (!failure) {
    failure = error;
    failureBlames = blamed;
    failureReason = reason;
  }
  failed.store(true, std::memory_order_release);
}

void Communicator::Impl::giveUp(int blamed) {
  if (gaveUp.exchange(true)) return;
  transport::GiveUpReason reason = executor->blamedReason();
  if (blamed < 0) {  // the failure came from elsewhere first (the device path)
    std::lock_guard<std::mutex> lock(failureMutex);
    blamed = failureBlames;
    reason = failureReason;
  }
  for (auto& transport : wiring.transports) transport->announceFailure(blamed, reason);
}

void Communicator::Impl::revoke() {
  if (revoked.exchange(true)) return;
  recordFailure(
      Error(ErrorCode::Revoked, format("braid rank %d: this rank revoked the communicator", rank)),
      rank, transport::GiveUpReason::Revoked);
  aborted.store(true);
  // The thread running ops (if any) fails at its next check and tells the
  // peers; none runs: tell them now. (An async op on the progress thread
  // counts as running until it failed.)
  if (running.load()) return;
  waitForAsyncIdle();
  if (!gaveUp) giveUp(-1);
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

}  // namespace braid
