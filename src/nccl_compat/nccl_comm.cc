// The C API's communicators and groups: init (also several ranks from one
// thread, and nonblocking), split, finalize, destroy, abort, queries, errors,
// ncclMemAlloc, registration, and ncclGroupStart/End. Collectives are in
// nccl_collectives.cc.
//
// Nothing throws across the C boundary: each call catches braid's errors,
// keeps the message for ncclGetLastError and returns the matching result.
//
// Groups follow NCCL: between ncclGroupStart and ncclGroupEnd, this thread's
// calls are collected (as a braid group on each communicator they touch) and
// run at ncclGroupEnd; communicators made in a group (init, split) are made
// at ncclGroupEnd, all at once, so that one thread can make several ranks.
// A nonblocking communicator (config.blocking = 0) runs its work on braid's
// progress thread: calls return ncclInProgress and ncclCommGetAsyncError
// says when it is done.
#include <optional>

#include "braid/memory.h"
#include "core/log.h"
#include "nccl_compat/nccl_internal.h"

static_assert(sizeof(ncclUniqueId) == sizeof(braid::UniqueId::bytes), "ids must match");

namespace braid::nccl {
namespace {

constexpr unsigned kConfigMagic = 0xcafebeef;

thread_local std::string tLastError;

}  // namespace

ncclResult_t resultOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return ncclInvalidArgument;
    case ErrorCode::InvalidUsage:
    case ErrorCode::Aborted:
    case ErrorCode::Revoked:  // as NCCL's calls on a revoked communicator
      return ncclInvalidUsage;
    case ErrorCode::SystemError:
      return ncclSystemError;
    case ErrorCode::RemoteError:
      return ncclRemoteError;
    case ErrorCode::Timeout:
      return ncclTimeout;
    case ErrorCode::Internal:
      return ncclInternalError;
  }
  return ncclInternalError;
}

// Keeps `message` for ncclGetLastError and returns `result`.
ncclResult_t failWith(ncclResult_t result, std::string message) {
  tLastError = std::move(message);
  return result;
}

// A bad argument of function `fn`.
ncclResult_t badArgument(const char* fn, const std::string& what) {
  return failWith(ncclInvalidArgument, format("%s: %s", fn, what.c_str()));
}

namespace {
thread_local Group tGroup;
}  // namespace

Group& openGroup() { return tGroup; }

// The communicator behind a handle, ready for a call of `fn`.
ncclComm& usable(ncclComm* comm, const char* fn, bool joinGroup) {
  if (!comm) throw Error(ErrorCode::InvalidArgument, "argument 'comm' is NULL");
  comm->waitReady();
  if (!comm->comm.valid())
    throw Error(ErrorCode::InvalidUsage, format("%s on a communicator that has no ranks", fn));
  // Inside a group, each communicator's calls gather in a braid group.
  if (joinGroup && tGroup.depth > 0 &&
      std::find(tGroup.comms.begin(), tGroup.comms.end(), comm) == tGroup.comms.end()) {
    comm->comm.groupStart();
    tGroup.comms.push_back(comm);
  }
  return *comm;
}

// Result of an op just issued: a nonblocking communicator keeps its work.
ncclResult_t issued(ncclComm& comm, Work work, std::shared_ptr<std::vector<std::byte>> scratch) {
  if (tGroup.depth > 0) {
    if (!comm.blocking)
      comm.keep({std::move(work), std::move(scratch)});
    else if (scratch)
      tGroup.scratch.push_back(
          {std::move(work), std::move(scratch)});  // until ncclGroupEnd returns
    return ncclSuccess;
  }
  if (comm.blocking) {
    // A device op runs on its stream after this returns: kept, so that
    // ncclCommGetAsyncError reports its failure.
    if (!work.test()) comm.keep({std::move(work), std::move(scratch)});
    return ncclSuccess;
  }
  comm.keep({std::move(work), std::move(scratch)});
  return ncclInProgress;
}

DataType typeOf(const ncclDataType_t& type, const char* fn) {
  const int raw = rawValue(type);
  if (raw < 0 || raw >= ncclNumTypes)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'datatype' is %d, not an ncclDataType_t", fn, raw));
  return static_cast<DataType>(raw);
}

namespace {

// Copies a user's config after checking it was initialized.
void readConfig(const ncclConfig_t* config, ncclComm* comm, const char* fn) {
  if (!config) return;
  if (config->magic != kConfigMagic || config->size < offsetof(ncclConfig_t, cgaClusterSize))
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'config' was not set from NCCL_CONFIG_INITIALIZER (magic "
                       "0x%x, size %zu)",
                       fn, config->magic, config->size));
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (config->blocking != 0 && config->blocking != 1)
      throw Error(ErrorCode::InvalidArgument,
                  format("%s: config->blocking is %d, must be 0 or 1", fn, config->blocking));
    comm->blocking = config->blocking == 1;
  }
  // A config of an earlier version holds the fields its size covers.
  auto holds = [config](size_t offset) { return config->size >= offset + sizeof(int); };
  if (holds(offsetof(ncclConfig_t, commName)) && config->commName) comm->name = config->commName;
  auto count = [&](size_t offset, int value, const char* name, int low, int& into) {
    if (!holds(offset) || value == NCCL_CONFIG_UNDEF_INT) return;
    if (value < low || value > ncclComm::kMaxRmaSignals)
      throw Error(ErrorCode::InvalidArgument,
                  format("%s: config->%s is %d, must be in [%d, %d]", fn, name, value, low,
                         ncclComm::kMaxRmaSignals));
    into = value;
  };
  count(offsetof(ncclConfig_t, numRmaCtx), config->numRmaCtx, "numRmaCtx", 0, comm->rmaContexts);
  count(offsetof(ncclConfig_t, numRmaSig), config->numRmaSig, "numRmaSig", 1, comm->rmaSignals);
  if (comm->rmaContexts * comm->rmaSignals > ncclComm::kMaxRmaSignals)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: config->numRmaCtx times config->numRmaSig is %d, above %d", fn,
                       comm->rmaContexts * comm->rmaSignals, ncclComm::kMaxRmaSignals));
  // NVIDIA's kernel, graph and NVLink settings, for whoever reads the log.
  const struct {
    size_t offset;
    const char* name;
  } unused[] = {{offsetof(ncclConfig_t, graphUsageMode), "graphUsageMode"},
                {offsetof(ncclConfig_t, maxP2pPeers), "maxP2pPeers"},
                {offsetof(ncclConfig_t, graphStreamOrdering), "graphStreamOrdering"},
                {offsetof(ncclConfig_t, launchOrderImplicit), "launchOrderImplicit"},
                {offsetof(ncclConfig_t, rmaEagerInit), "rmaEagerInit"},
                {offsetof(ncclConfig_t, hostCftMode), "hostCftMode"},
                {offsetof(ncclConfig_t, nvlsHostMode), "nvlsHostMode"}};
  for (const auto& field : unused) {
    int value;
    if (!holds(field.offset)) continue;
    std::memcpy(&value, reinterpret_cast<const char*>(config) + field.offset, sizeof value);
    if (value != NCCL_CONFIG_UNDEF_INT)
      BRAID_INFO(Init, "%s: config->%s = %d is not used by braid", fn, field.name, value);
  }
}

braid::UniqueId idOf(const ncclUniqueId& id) {
  braid::UniqueId braidId;
  std::memcpy(braidId.bytes.data(), id.internal, sizeof(id.internal));
  return braidId;
}

// Makes the communicator behind `comm` by `make`: now, at ncclGroupEnd, or
// on a thread of its own for a nonblocking one.
ncclResult_t create(ncclComm* comm, std::function<Communicator()> make) {
  if (tGroup.depth > 0) {
    comm->ready = false;
    tGroup.creations.push_back([comm, make = std::move(make)] {
      if (std::exception_ptr failure = comm->build(make)) std::rethrow_exception(failure);
    });
    return ncclSuccess;
  }
  if (comm->blocking) {
    if (std::exception_ptr failure = comm->build(make)) std::rethrow_exception(failure);
    return ncclSuccess;
  }
  comm->ready = false;
  comm->initThread = std::thread([comm, make = std::move(make)] { comm->build(make); });
  return ncclInProgress;
}

// A communicator made from `parent` by `make` (a shrink, a grow): it keeps
// the parent's device and blocking mode unless `config` says otherwise, and
// is made as create() says (now, at ncclGroupEnd, or on a thread of its own).
ncclResult_t childOf(ncclComm* parent, ncclConfig_t* config, const char* fn, ncclComm_t* newcomm,
                     std::function<Communicator(Communicator&)> make) {
  auto child = std::make_unique<ncclComm>();
  child->device = parent->device;
  child->blocking = parent->blocking;
  child->rmaContexts = parent->rmaContexts;
  child->rmaSignals = parent->rmaSignals;
  readConfig(config, child.get(), fn);
  Communicator* from = &parent->comm;
  ncclComm* handle = child.release();
  *newcomm = handle;
  try {
    return create(handle, [from, make = std::move(make)] { return make(*from); });
  } catch (...) {
    *newcomm = nullptr;
    delete handle;
    throw;
  }
}

ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, const char* fn) {
  return guarded(fn, [&] {
    if (!out) return badArgument(fn, "argument 'comm' is NULL");
    if (nranks < 1)
      return badArgument(fn, format("argument 'nranks' is %d, must be at least 1", nranks));
    if (rank < 0 || rank >= nranks)
      return badArgument(fn, format("argument 'rank' is %d, not in [0, %d)", rank, nranks));
    auto comm = std::make_unique<ncclComm>();
    readConfig(config, comm.get(), fn);
    const braid::UniqueId braidId = idOf(id);
    ncclComm* handle = comm.get();
    const ncclResult_t result =
        create(handle, [=] { return Communicator::init(nranks, rank, braidId); });
    *out = comm.release();
    return result;
  });
}

// Runs `count` jobs at once (each on a thread, the last on this one) and
// rethrows the first failure.
void runTogether(std::vector<std::function<void()>>& jobs) {
  std::vector<std::exception_ptr> errors(jobs.size());
  std::vector<std::thread> threads;
  std::exception_ptr noThread;
  try {
    for (size_t i = 0; i + 1 < jobs.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          jobs[i]();
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
  } catch (...) {  // out of threads: the started jobs end (by their timeout at worst)
    noThread = std::current_exception();
  }
  if (noThread) {
    for (std::thread& thread : threads) thread.join();
    std::rethrow_exception(noThread);
  }
  if (!jobs.empty()) {
    try {
      jobs.back()();
    } catch (...) {
      errors.back() = std::current_exception();
    }
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}
}  // namespace
}  // namespace braid::nccl

using namespace braid::nccl;

void ncclComm::forgetFinished() {
  size_t kept = 0;
  for (Outstanding& pending : outstanding) {
    if (!pending.work.test()) {
      outstanding[kept++] = std::move(pending);
      continue;
    }
    try {
      pending.work.wait();  // finished: returns at once, or throws its error
    } catch (const Error& error) {
      if (asyncError == ncclSuccess) {
        asyncError = resultOf(error.code());
        asyncMessage = error.what();
      }
    }
  }
  outstanding.resize(kept);
}

void ncclComm::keep(Outstanding work) {
  std::lock_guard<std::mutex> lock(mutex);
  forgetFinished();
  outstanding.push_back(std::move(work));
}

ncclResult_t ncclComm::poll(std::string* message) {
  std::lock_guard<std::mutex> lock(mutex);
  forgetFinished();
  if (asyncError != ncclSuccess) {
    *message = asyncMessage;
    return asyncError;
  }
  // (A blocking communicator's calls are done when they return; its device
  // ops in flight are the stream's business.)
  return outstanding.empty() || blocking ? ncclSuccess : ncclInProgress;
}

void ncclComm::drain() {
  std::vector<Outstanding> all;
  {
    std::lock_guard<std::mutex> lock(mutex);
    all.swap(outstanding);
  }
  for (Outstanding& pending : all) {
    try {
      pending.work.wait();
    } catch (const Error&) {
    }
  }
}

std::exception_ptr ncclComm::build(const std::function<Communicator()>& make) {
  std::exception_ptr failure;
  try {
    comm = make();
  } catch (const Error& error) {
    initResult = resultOf(error.code());
    initCode = error.code();
    initError = error.what();
    failure = std::current_exception();
  } catch (const std::exception& error) {
    initResult = ncclSystemError;
    initCode = ErrorCode::SystemError;
    initError = error.what();
    failure = std::current_exception();
  }
  ready = true;
  return failure;
}

extern "C" {

NCCL_EXPORT void pncclResetDebugInit(void) { braid::log::reload(); }

NCCL_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (!version) return badArgument("ncclGetVersion", "argument 'version' is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded("ncclGetUniqueId", [&] {
    if (!uniqueId) return badArgument("ncclGetUniqueId", "argument 'uniqueId' is NULL");
    const braid::UniqueId id = Communicator::newUniqueId();
    std::memcpy(uniqueId->internal, id.bytes.data(), sizeof(uniqueId->internal));
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                 int rank, ncclConfig_t* config) {
  return initRank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

NCCL_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                           int rank) {
  return initRank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

NCCL_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                   int nId, ncclUniqueId* commIds,
                                                   ncclConfig_t* config) {
  const char* fn = "ncclCommInitRankScalable";
  if (nId < 1) return badArgument(fn, format("argument 'nId' is %d, must be at least 1", nId));
  if (!commIds) return badArgument(fn, "argument 'commIds' is NULL");
  return initRank(newcomm, nranks, commIds[0], myrank, config, fn);
}

NCCL_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const char* fn = "ncclCommInitAll";
  return guarded(fn, [&] {
    if (!comms) return badArgument(fn, "argument 'comm' is NULL");
    if (ndev < 1) return badArgument(fn, format("argument 'ndev' is %d, must be at least 1", ndev));
    if (tGroup.depth > 0)
      return failWith(ncclInvalidUsage, format("%s: not allowed inside a group", fn));
    std::vector<int> devices(static_cast<size_t>(ndev));
    for (int i = 0; i < ndev; ++i) devices[i] = devlist ? devlist[i] : i;
    if (braid::device::Device* device = braid::device::current())
      for (int i = 0; i < ndev; ++i)
        if (devices[i] < 0 || devices[i] >= device->count())
          return badArgument(
              fn, format("argument 'devlist[%d]' is %d, and this process has %d "
                         "%s devices (0 to %d)",
                         i, devices[i], device->count(), device->name(), device->count() - 1));
    std::vector<Communicator> ranks = Communicator::initAll(devices);
    for (int i = 0; i < ndev; ++i) {
      auto comm = std::make_unique<ncclComm>();
      comm->device = devices[i];
      comm->comm = std::move(ranks[i]);
      comms[i] = comm.release();
    }
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  const char* fn = "ncclCommFinalize";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (!comm->ready) return ncclInProgress;
    comm->waitReady();
    if (!comm->blocking) {
      ncclResult_t state;
      pncclCommGetAsyncError(comm, &state);
      return state;
    }
    std::string message;
    comm->drain();
    const ncclResult_t state = comm->poll(&message);  // an error of work run earlier
    if (state != ncclSuccess) return failWith(state, message);
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  const char* fn = "ncclCommDestroy";
  if (!comm) return ncclSuccess;
  return guarded(fn, [&] {
    comm->drain();
    delete comm;
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  return guarded("ncclCommAbort", [&] {
    comm->joinInit();  // (braid's init cannot be cut short: it ends by its timeout)
    if (comm->comm.valid()) comm->comm.abort();
    comm->drain();  // they fail at once: aborted
    // A call blocked in this communicator on another thread returns within a
    // second of abort(); it must have left before the handle goes.
    while (comm->calls.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    delete comm;
    return ncclSuccess;
  });
}

// braid's revoke also tells the peers (NCCL's is local to the rank that
// calls it): their ops on the communicator fail too, with ncclInvalidUsage,
// as NCCL's do on a communicator revoked there.
NCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  const char* fn = "ncclCommRevoke";
  if (!comm) return ncclSuccess;
  return guarded(fn, [&] {
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      return badArgument(
          fn, format("argument 'revokeFlags' is %d, must be NCCL_REVOKE_DEFAULT (0)", revokeFlags));
    comm->waitReady();
    if (comm->revoked.exchange(true))
      return badArgument(fn, "the communicator was revoked already");
    comm->comm.revoke();
    // Its work in flight fails at once; once it has, the communicator is
    // quiet, and that is the state ncclCommGetAsyncError reports (NCCL's
    // after a revoke), not the failures of the work it stopped.
    comm->drain();
    std::lock_guard<std::mutex> lock(comm->mutex);
    comm->asyncError = ncclSuccess;
    comm->asyncMessage.clear();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                        ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (!newcomm) return badArgument(fn, "argument 'newcomm' is NULL");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      return badArgument(fn, format("argument 'color' is %d: must be at least 0, or "
                                    "NCCL_SPLIT_NOCOLOR",
                                    color));
    comm->waitReady();
    auto child = std::make_unique<ncclComm>();
    child->device = comm->device;
    child->blocking = comm->blocking;
    child->rmaContexts = comm->rmaContexts;
    child->rmaSignals = comm->rmaSignals;
    readConfig(config, child.get(), fn);
    Communicator* parent = &comm->comm;
    // braid's split is collective: every rank takes part, also one without
    // a color (it gets NULL, at once). It runs on the parent, in this
    // thread (or at ncclGroupEnd, after the group's operations): never
    // beside other calls on the parent.
    if (tGroup.depth > 0) {
      ncclComm* handle = nullptr;
      if (color != NCCL_SPLIT_NOCOLOR) {
        handle = child.release();
        handle->ready = false;
      }
      *newcomm = handle;
      tGroup.creations.push_back([=] {
        if (!handle) {
          parent->split(color, key);
          return;
        }
        if (std::exception_ptr failure = handle->build([=] { return parent->split(color, key); }))
          std::rethrow_exception(failure);
      });
      return ncclSuccess;
    }
    Communicator made = parent->split(color, key);
    if (!made.valid()) {
      *newcomm = nullptr;  // NCCL_SPLIT_NOCOLOR
      return ncclSuccess;
    }
    child->comm = std::move(made);
    *newcomm = child.release();
    return ncclSuccess;
  });
}

// Only the ranks that stay call it, with the same list. braid's shrink
// runs a rendezvous among them over the parent's listeners, so it also
// works when the excluded ranks are dead or stopped; the parent is left to
// ncclCommDestroy or ncclCommAbort (after NCCL_SHRINK_ABORT it is aborted,
// and neither waits for a peer).
NCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                         int excludeRanksCount, ncclComm_t* newcomm,
                                         ncclConfig_t* config, int shrinkFlags) {
  const char* fn = "ncclCommShrink";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (!newcomm) return badArgument(fn, "argument 'newcomm' is NULL");
    if (!excludeRanksList) return badArgument(fn, "argument 'excludeRanksList' is NULL");
    if (excludeRanksCount <= 0)
      return badArgument(
          fn, format("argument 'excludeRanksCount' is %d, must be at least 1", excludeRanksCount));
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      return badArgument(fn, format("argument 'shrinkFlags' is %d, must be NCCL_SHRINK_DEFAULT "
                                    "(0) or NCCL_SHRINK_ABORT (1)",
                                    shrinkFlags));
    comm->waitReady();
    std::sort(excludeRanksList, excludeRanksList + excludeRanksCount);  // as NCCL does
    std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
    const braid::ShrinkFlags flags =
        shrinkFlags == NCCL_SHRINK_ABORT ? braid::ShrinkFlags::Abort : braid::ShrinkFlags::Default;
    return childOf(comm, config, fn, newcomm, [excluded, flags](Communicator& parent) {
      return parent.shrink(excluded, flags);
    });
  });
}

// Growing, NCCL 2.29's model: one member makes the id (ncclCommGetUniqueId)
// and ships it to the new ranks; the members call ncclCommGrow on the
// parent (rank -1; that member with the id, the others with NULL), the new
// ranks with a NULL parent, the id and their rank.
NCCL_EXPORT ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  const char* fn = "ncclCommGetUniqueId";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (!uniqueId) return badArgument(fn, "argument 'uniqueId' is NULL");
    comm->waitReady();
    const braid::UniqueId id = comm->comm.growId();
    std::memcpy(uniqueId->internal, id.bytes.data(), sizeof(uniqueId->internal));
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
                                       int rank, ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* fn = "ncclCommGrow";
  if (!comm) {  // a new rank
    if (!uniqueId)
      return guarded(fn, [&] {
        return badArgument(fn, "argument 'uniqueId' is NULL for a new rank (comm NULL)");
      });
    return initRank(newcomm, nRanks, *uniqueId, rank, config, fn);
  }
  return guarded(fn, [&] {
    if (!newcomm) return badArgument(fn, "argument 'newcomm' is NULL");
    if (rank != -1)
      return badArgument(
          fn, format("argument 'rank' is %d: a member keeps its rank and passes -1", rank));
    comm->waitReady();
    std::optional<braid::UniqueId> id;
    if (uniqueId) id = idOf(*uniqueId);
    return childOf(comm, config, fn, newcomm, [nRanks, id](Communicator& parent) {
      return parent.grow(nRanks, id ? &*id : nullptr);
    });
  });
}

NCCL_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  switch (static_cast<ncclResult_t>(std::clamp(rawValue(result), 0, int{ncclNumResults}))) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error (the operating system refused, or out of memory)";
    case ncclInternalError:
      return "internal error (a braid bug, or peers that do not run the same collectives)";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited, failed or stopped answering";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclTimeout:
      return "timeout: a wait passed the communicator's timeout";
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

NCCL_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  (void)comm;  // braid keeps one message per thread: a watchdog's calls do not overwrite it
  return tLastError.c_str();
}

NCCL_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const char* fn = "ncclCommGetAsyncError";
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  if (!asyncError) return badArgument(fn, "argument 'asyncError' is NULL");
  if (!comm->ready) {
    *asyncError = ncclInProgress;
    return ncclSuccess;
  }
  comm->joinInit();
  if (comm->initResult != ncclSuccess) {
    *asyncError = comm->initResult;
    tLastError = comm->initError;
    return ncclSuccess;
  }
  std::string message;
  *asyncError = comm->poll(&message);
  if (*asyncError != ncclSuccess && *asyncError != ncclInProgress) tLastError = message;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return guarded("ncclCommCount", [&] {
    if (ncclResult_t bad = need(count, "ncclCommCount", "count")) return bad;
    *count = usable(comm, "ncclCommCount", false).comm.size();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded("ncclCommCuDevice", [&] {
    if (ncclResult_t bad = need(device, "ncclCommCuDevice", "device")) return bad;
    ncclComm& c = usable(comm, "ncclCommCuDevice", false);
    *device = c.device >= 0 ? c.device : c.comm.device();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded("ncclCommUserRank", [&] {
    if (ncclResult_t bad = need(rank, "ncclCommUserRank", "rank")) return bad;
    *rank = usable(comm, "ncclCommUserRank", false).comm.rank();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", [&] {
    if (ncclResult_t bad = need(ptr, "ncclMemAlloc", "ptr")) return bad;
    // Device memory where the process has a device (cuMem, which peers on
    // this host map); else host memory that they map (braid::memAlloc).
    if (braid::device::Device* device = braid::device::current()) {
      if (size == 0) return badArgument("ncclMemAlloc", "argument 'size' is 0");
      *ptr = device->allocate(device->current(), size);
    } else {
      *ptr = braid::memAlloc(size);
    }
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  return guarded("ncclMemFree", [&] {
    braid::device::Device* device = braid::device::current();
    if (ptr && device && device->deviceOf(ptr) >= 0)
      device->free(ptr);
    else
      braid::memFree(ptr);
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                           void** handle) {
  const char* fn = "ncclCommRegister";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (ncclResult_t bad = need(handle, fn, "handle")) return bad;
    if (!buff && size > 0) return badArgument(fn, "argument 'buff' is NULL");
    auto* registration = new ncclComm::Registration{buff, size};
    comm->registrations.insert(registration);
    *handle = registration;
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  const char* fn = "ncclCommDeregister";
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  auto* registration = static_cast<ncclComm::Registration*>(handle);
  if (!comm->registrations.erase(registration))
    return badArgument(fn,
                       "argument 'handle' was not returned by ncclCommRegister on this "
                       "communicator, or was deregistered already");
  delete registration;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                 ncclWindow_t* win, int winFlags) {
  const char* fn = "ncclCommWindowRegister";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (ncclResult_t bad = need(win, fn, "win")) return bad;
    constexpr int kKnownFlags = NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING |
                                NCCL_WIN_GIN_ONLY | NCCL_WIN_CFT_COUNTED;
    if ((winFlags & ~kKnownFlags) != 0)
      return badArgument(fn, format("argument 'winFlags' is 0x%x: bits 0x%x are no NCCL_WIN_ flag",
                                    winFlags, winFlags & ~kKnownFlags));
    auto handle = std::make_unique<ncclWindow_vidmem>();
    handle->comm = comm;
    handle->user = buff;
    ncclWindow_vidmem* made = handle.get();
    auto make = [made, buff, size, fn] {
      ncclComm& c = usable(made->comm, fn, false);
      made->window = c.comm.registerWindow(buff, size);
      braid::device::Device* device = braid::device::current();
      if (device && device->deviceOf(buff) >= 0) c.deviceWindows = true;
    };
    // In a group (one thread registering for several ranks), at its end.
    if (tGroup.depth > 0)
      tGroup.creations.push_back(make);
    else
      make();
    *win = handle.release();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  const char* fn = "ncclWinGetUserPtr";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (ncclResult_t bad = need(outUserPtr, fn, "outUserPtr")) return bad;
    if (!win || win->comm != comm)
      return badArgument(fn, "argument 'win' was not registered on this communicator");
    *outUserPtr = win->user;
    return ncclSuccess;
  });
}

// The host-side calls of NCCL's device API (nccl_device/core.h, NCCL 2.28
// on) that programs link against, PyTorch among them. The pointer calls
// work on braid's windows; the device communicator, whose struct serves
// NCCL's own device-side library, is refused naming why.

extern "C" NCCL_EXPORT ncclResult_t pncclGetPeerDevicePointer(ncclWindow_t win, size_t offset,
                                                              int peer, void** outPtr) {
  const char* fn = "ncclGetPeerDevicePointer";
  return guarded(fn, [&] {
    if (ncclResult_t bad = need(outPtr, fn, "outPtr")) return bad;
    if (!win || !win->comm) return badArgument(fn, "argument 'window' is not a registered window");
    if (win->window.id == 0)
      return badArgument(fn, "argument 'window' is not registered yet (its group has not ended)");
    *outPtr = usable(win->comm, fn, false).comm.peerPointer(win->window, offset, peer);
    return ncclSuccess;
  });
}

// braid makes no multicast (NVLink SHARP) memory: there is no multimem
// address, which NCCL gives as NULL.
extern "C" NCCL_EXPORT ncclResult_t pncclGetLsaMultimemDevicePointer(ncclWindow_t win,
                                                                     size_t offset, void** outPtr) {
  const char* fn = "ncclGetLsaMultimemDevicePointer";
  return guarded(fn, [&] {
    static_cast<void>(offset);
    if (ncclResult_t bad = need(outPtr, fn, "outPtr")) return bad;
    if (!win || !win->comm) return badArgument(fn, "argument 'window' is not a registered window");
    *outPtr = nullptr;
    return ncclSuccess;
  });
}

extern "C" NCCL_EXPORT ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void* reqs,
                                                       void* outDevComm) {
  const char* fn = "ncclDevCommCreate";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (ncclResult_t bad = need(reqs, fn, "reqs")) return bad;
    if (ncclResult_t bad = need(outDevComm, fn, "outDevComm")) return bad;
    return failWith(ncclInvalidUsage,
                    format("%s: braid has no NCCL device API (device communicators for kernels "
                           "that call NCCL's LSA, multimem and GIN functions); its collectives, "
                           "windows and one-sided calls are host calls",
                           fn));
  });
}

extern "C" NCCL_EXPORT ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  const char* fn = "ncclDevCommDestroy";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    static_cast<void>(devComm);
    return badArgument(fn,
                       "argument 'devComm' was not made by ncclDevCommCreate, which braid "
                       "refuses: there is no device communicator to destroy");
  });
}

NCCL_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  const char* fn = "ncclCommWindowDeregister";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (!win || win->comm != comm)
      return badArgument(fn, "argument 'win' was not registered on this communicator");
    auto unmake = [win, fn] {
      std::unique_ptr<ncclWindow_vidmem> handle(win);
      usable(win->comm, fn, false).comm.deregisterWindow(win->window);
    };
    if (tGroup.depth > 0)
      tGroup.creations.push_back(unmake);
    else
      unmake();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclGroupStart() {
  ++tGroup.depth;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclGroupEnd() {
  const char* fn = "ncclGroupEnd";
  if (tGroup.depth == 0)
    return failWith(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart to match");
  if (--tGroup.depth > 0) return ncclSuccess;
  Group group = std::move(tGroup);
  tGroup = Group();
  return guarded(fn, [&] {
    // First each communicator's braid group, several at once (one process
    // may drive several ranks), a nonblocking one in the background; then
    // the communicators made in the group (a split runs on its parent,
    // whose group has ended by then).
    std::vector<std::function<void()>> ends;
    bool pending = false;
    for (ncclComm* comm : group.comms) {
      ends.push_back([comm] { comm->comm.groupEnd(); });
      if (!comm->blocking) pending = true;
    }
    std::exception_ptr failure;
    try {
      runTogether(ends);
    } catch (const Error&) {
      failure = std::current_exception();
    }
    runTogether(group.creations);
    if (failure) std::rethrow_exception(failure);
    return pending ? ncclInProgress : ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return failWith(ncclInvalidUsage,
                  "ncclGroupSimulateEnd: not supported by braid yet (braid-sim predicts "
                  "collective times from the command line); any group stays open: end it with "
                  "ncclGroupEnd");
}

}  // extern "C"

// (GCC finds some targets cannot throw and would like the aliases to say so.)
#pragma GCC diagnostic ignored "-Wmissing-attributes"
NCCL_ALIAS(void, ResetDebugInit, (void));
NCCL_ALIAS(ncclResult_t, GetVersion, (int* version));
NCCL_ALIAS(ncclResult_t, GetUniqueId, (ncclUniqueId * uniqueId));
NCCL_ALIAS(ncclResult_t, CommInitRankConfig,
           (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config));
NCCL_ALIAS(ncclResult_t, CommInitRank,
           (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank));
NCCL_ALIAS(ncclResult_t, CommInitAll, (ncclComm_t * comm, int ndev, const int* devlist));
NCCL_ALIAS(ncclResult_t, CommInitRankScalable,
           (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
            ncclConfig_t* config));
NCCL_ALIAS(ncclResult_t, CommFinalize, (ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, CommDestroy, (ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, CommAbort, (ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, CommRevoke, (ncclComm_t comm, int revokeFlags));
NCCL_ALIAS(ncclResult_t, CommSplit,
           (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config));
NCCL_ALIAS(ncclResult_t, CommShrink,
           (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
            ncclConfig_t* config, int shrinkFlags));
NCCL_ALIAS(ncclResult_t, CommGetUniqueId, (ncclComm_t comm, ncclUniqueId* uniqueId));
NCCL_ALIAS(ncclResult_t, CommGrow,
           (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
            ncclComm_t* newcomm, ncclConfig_t* config));
NCCL_ALIAS(const char*, GetErrorString, (ncclResult_t result));
NCCL_ALIAS(const char*, GetLastError, (ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, CommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError));
NCCL_ALIAS(ncclResult_t, CommCount, (const ncclComm_t comm, int* count));
NCCL_ALIAS(ncclResult_t, CommCuDevice, (const ncclComm_t comm, int* device));
NCCL_ALIAS(ncclResult_t, CommUserRank, (const ncclComm_t comm, int* rank));
NCCL_ALIAS(ncclResult_t, MemAlloc, (void** ptr, size_t size));
NCCL_ALIAS(ncclResult_t, MemFree, (void* ptr));
NCCL_ALIAS(ncclResult_t, CommRegister,
           (const ncclComm_t comm, void* buff, size_t size, void** handle));
NCCL_ALIAS(ncclResult_t, CommDeregister, (const ncclComm_t comm, void* handle));
NCCL_ALIAS(ncclResult_t, CommWindowRegister,
           (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags));
NCCL_ALIAS(ncclResult_t, CommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));
NCCL_ALIAS(ncclResult_t, WinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr));
NCCL_ALIAS(ncclResult_t, GetPeerDevicePointer,
           (ncclWindow_t win, size_t offset, int peer, void** outPtr));
NCCL_ALIAS(ncclResult_t, GetLsaMultimemDevicePointer,
           (ncclWindow_t win, size_t offset, void** outPtr));
NCCL_ALIAS(ncclResult_t, DevCommCreate, (ncclComm_t comm, const void* reqs, void* outDevComm));
NCCL_ALIAS(ncclResult_t, DevCommDestroy, (ncclComm_t comm, const void* devComm));
NCCL_ALIAS(ncclResult_t, GroupStart, ());
NCCL_ALIAS(ncclResult_t, GroupEnd, ());
NCCL_ALIAS(ncclResult_t, GroupSimulateEnd, (ncclSimInfo_t * simInfo));
