// The NCCL C API (include/braid/nccl/nccl.h) over braid::Communicator:
// libnccl.so.2. Every function is defined under its pnccl name and exported
// under its nccl name too, as a weak alias (a profiler may interpose it).
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
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "braid/braid.h"
#include "braid/memory.h"
#include "braid/nccl/nccl.h"
#include "core/errors.h"
#include "reduce/float_convert.h"

#define NCCL_EXPORT __attribute__((visibility("default")))
// Defines pncclNAME and makes ncclNAME a weak alias of it.
#define NCCL_ALIAS(ret, name, args) \
  extern "C" NCCL_EXPORT ret nccl##name args __attribute__((weak, alias("pnccl" #name)))

static_assert(sizeof(ncclUniqueId) == sizeof(braid::UniqueId::bytes), "ids must match");
static_assert(static_cast<int>(ncclNumTypes) == braid::kNumDataTypes, "types must match");

namespace {

using braid::Communicator;
using braid::DataType;
using braid::Error;
using braid::ErrorCode;
using braid::format;
using braid::ReduceOp;
using braid::Stream;
using braid::Work;

constexpr unsigned kConfigMagic = 0xcafebeef;

thread_local std::string tLastError;

ncclResult_t resultOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return ncclInvalidArgument;
    case ErrorCode::InvalidUsage:
    case ErrorCode::Aborted:
      return ncclInvalidUsage;
    case ErrorCode::SystemError:
      return ncclSystemError;
    case ErrorCode::RemoteError:
    case ErrorCode::Timeout:
      return ncclRemoteError;
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

// Runs `body`, turning what it throws into a result.
template <typename Body>
ncclResult_t guarded(const char* fn, Body&& body) {
  try {
    return body();
  } catch (const Error& error) {
    return failWith(resultOf(error.code()), format("%s: %s", fn, error.what()));
  } catch (const std::bad_alloc&) {
    return failWith(ncclSystemError, format("%s: out of memory", fn));
  } catch (const std::exception& error) {
    return failWith(ncclInternalError, format("%s: %s", fn, error.what()));
  }
}

}  // namespace

// A communicator handle. `comm` is set once the communicator exists: at
// once for a blocking init outside a group, at ncclGroupEnd inside one, on
// the init thread for a nonblocking one.
struct ncclComm {
  Communicator comm;
  int device = -1;
  bool blocking = true;
  std::string name;

  // A nonblocking init runs on `initThread`; `ready` says it has finished,
  // `initResult` how.
  std::thread initThread;
  std::atomic<bool> ready{true};
  ncclResult_t initResult = ncclSuccess;
  std::string initError;

  // Work issued on the progress thread and not yet seen complete, with the
  // scratch it reads (a pre-multiplied input).
  struct Outstanding {
    Work work;
    std::shared_ptr<std::vector<std::byte>> scratch;
  };
  std::vector<Outstanding> outstanding;
  ncclResult_t asyncError = ncclSuccess;  // the first error of work that ran in the background
  std::string asyncMessage;

  // Operators from ncclRedOpCreatePreMulSum, numbered from ncclNumOps.
  struct PreMulSum {
    bool live = false;
    ncclDataType_t type = ncclFloat32;
    bool immediate = false;
    std::array<std::byte, 8> value{};  // the scalar, when immediate
    const void* scalar = nullptr;      // read at each collective otherwise
  };
  std::vector<PreMulSum> redOps;

  struct Registration {
    void* buffer;
    size_t size;
  };
  std::unordered_set<Registration*> registrations;

  ~ncclComm() {
    if (initThread.joinable()) initThread.join();
    for (Registration* registration : registrations) delete registration;
  }

  // Waits for a nonblocking init; its failure is the communicator's.
  void waitReady() {
    if (initThread.joinable()) initThread.join();
    if (initResult != ncclSuccess) throw Error(ErrorCode::InvalidUsage, initError);
  }
};

namespace {

// This thread's open group.
struct Group {
  int depth = 0;
  std::vector<ncclComm*> comms;                  // communicators with calls in it, first use first
  std::vector<std::function<void()>> creations;  // inits and splits, run at ncclGroupEnd
  std::vector<ncclComm::Outstanding> keep;       // scratch the group's ops read
};
thread_local Group tGroup;

Stream streamFor(const ncclComm* comm) { return comm->blocking ? Stream() : Stream::async(); }

// The communicator behind a handle, ready for a call of `fn`.
ncclComm& usable(ncclComm* comm, const char* fn) {
  if (!comm) throw Error(ErrorCode::InvalidArgument, "argument 'comm' is NULL");
  comm->waitReady();
  if (!comm->comm.valid())
    throw Error(ErrorCode::InvalidUsage, format("%s on a communicator that has no ranks", fn));
  // Inside a group, each communicator's calls gather in a braid group.
  if (tGroup.depth > 0 &&
      std::find(tGroup.comms.begin(), tGroup.comms.end(), comm) == tGroup.comms.end()) {
    comm->comm.groupStart();
    tGroup.comms.push_back(comm);
  }
  return *comm;
}

// Result of an op just issued: a nonblocking communicator keeps its work.
ncclResult_t issued(ncclComm& comm, Work work,
                    std::shared_ptr<std::vector<std::byte>> scratch = nullptr) {
  if (tGroup.depth > 0) {
    if (!comm.blocking)
      comm.outstanding.push_back({std::move(work), std::move(scratch)});
    else if (scratch)
      tGroup.keep.push_back({std::move(work), std::move(scratch)});  // until ncclGroupEnd returns
    return ncclSuccess;
  }
  if (comm.blocking) return ncclSuccess;
  comm.outstanding.push_back({std::move(work), std::move(scratch)});
  return ncclInProgress;
}

// The int a caller passed as an enum. A C caller may pass any int, and
// reading an out-of-range value as the enum type is undefined in C++: its
// bytes are read instead.
template <typename Enum>
int rawValue(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "NCCL's enums are int-sized");
  int raw;
  std::memcpy(&raw, &value, sizeof(raw));
  return raw;
}

DataType typeOf(const ncclDataType_t& type, const char* fn) {
  const int raw = rawValue(type);
  if (raw < 0 || raw >= ncclNumTypes)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'datatype' is %d, not an ncclDataType_t", fn, raw));
  return static_cast<DataType>(raw);
}

// Multiplies `count` elements of `type` at `in` by the scalar at `scalar`
// (of the same type) into `out`, in the type's own arithmetic: integers wrap,
// narrow floats are multiplied in float and rounded once.
void scale(void* out, const void* in, size_t count, ncclDataType_t type, const void* scalar) {
  namespace fc = braid::reduce::detail;
  auto each = [&](auto tag, auto widen, auto narrow) {
    using T = decltype(tag);
    T factor;
    std::memcpy(&factor, scalar, sizeof(T));
    const auto f = widen(factor);
    const T* from = static_cast<const T*>(in);
    T* to = static_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) to[i] = narrow(widen(from[i]) * f);
  };
  auto same = [](auto v) { return v; };
  auto wrap = [](auto tag) {  // integer multiply modulo 2^bits
    using T = decltype(tag);
    using U = std::make_unsigned_t<T>;
    using Wide = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return [](T a, T b) { return static_cast<T>(static_cast<U>(Wide(U(a)) * Wide(U(b)))); };
  };
  auto integers = [&](auto tag) {
    using T = decltype(tag);
    T factor;
    std::memcpy(&factor, scalar, sizeof(T));
    const auto mul = wrap(tag);
    const T* from = static_cast<const T*>(in);
    T* to = static_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) to[i] = mul(from[i], factor);
  };
  switch (type) {
    case ncclInt8:
      return integers(int8_t{});
    case ncclUint8:
      return integers(uint8_t{});
    case ncclInt32:
      return integers(int32_t{});
    case ncclUint32:
      return integers(uint32_t{});
    case ncclInt64:
      return integers(int64_t{});
    case ncclUint64:
      return integers(uint64_t{});
    case ncclFloat32:
      return each(float{}, same, same);
    case ncclFloat64:
      return each(double{}, same, same);
    case ncclFloat16:
      return each(uint16_t{}, fc::halfToFloatInline, fc::floatToHalfInline);
    case ncclBfloat16:
      return each(uint16_t{}, fc::bf16ToFloatInline, fc::floatToBf16Inline);
    case ncclFloat8e4m3:
      return each(uint8_t{}, fc::fp8e4m3ToFloatInline, fc::floatToFp8e4m3Inline);
    case ncclFloat8e5m2:
      return each(uint8_t{}, fc::fp8e5m2ToFloatInline, fc::floatToFp8e5m2Inline);
    case ncclNumTypes:
      break;
  }
}

// A reduction operator resolved for one call: braid's op, and for a
// PreMulSum the scalar that multiplies the inputs first (null otherwise).
struct Reduction {
  ReduceOp op = ReduceOp::Sum;
  const void* scalar = nullptr;
};

Reduction reductionOf(const ncclComm& comm, const ncclRedOp_t& op, ncclDataType_t type,
                      const char* fn) {
  const int value = rawValue(op);
  if (value >= 0 && value < ncclNumOps) return {static_cast<ReduceOp>(value), nullptr};
  const size_t index = static_cast<size_t>(value - ncclNumOps);
  if (value < ncclNumOps || index >= comm.redOps.size() || !comm.redOps[index].live)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'op' is %d, neither a built-in operator nor one made by "
                       "ncclRedOpCreatePreMulSum on this communicator",
                       fn, value));
  const ncclComm::PreMulSum& custom = comm.redOps[index];
  if (custom.type != type)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'op' %d was made for datatype %d, not %d", fn, value,
                       static_cast<int>(custom.type), static_cast<int>(type)));
  return {ReduceOp::Sum, custom.immediate ? custom.value.data() : custom.scalar};
}

// The input of a reducing call under `reduction`: `send` itself, or a copy
// multiplied by the PreMulSum scalar (kept in *scratch until the op is done).
const void* reductionInput(const Reduction& reduction, const void* send, size_t count,
                           ncclDataType_t type, std::shared_ptr<std::vector<std::byte>>* scratch) {
  if (!reduction.scalar || count == 0 || !send) return send;
  const size_t bytes = count * braid::dataTypeSize(static_cast<DataType>(type));
  *scratch = std::make_shared<std::vector<std::byte>>(bytes);
  scale((*scratch)->data(), send, count, type, reduction.scalar);
  return (*scratch)->data();
}

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
  if (config->size >= offsetof(ncclConfig_t, collnetEnable) && config->commName)
    comm->name = config->commName;
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
      comm->comm = make();
      comm->ready = true;
    });
    return ncclSuccess;
  }
  if (comm->blocking) {
    comm->comm = make();
    return ncclSuccess;
  }
  comm->ready = false;
  comm->initThread = std::thread([comm, make = std::move(make)] {
    try {
      comm->comm = make();
    } catch (const Error& error) {
      comm->initResult = resultOf(error.code());
      comm->initError = error.what();
    } catch (const std::exception& error) {
      comm->initResult = ncclSystemError;
      comm->initError = error.what();
    }
    comm->ready = true;
  });
  return ncclInProgress;
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
  for (size_t i = 0; i + 1 < jobs.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        jobs[i]();
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
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

// ncclSuccess when `pointer` is set, else the error naming argument `name`.
template <typename T>
ncclResult_t need(T* pointer, const char* fn, const char* name) {
  return pointer ? ncclSuccess : badArgument(fn, format("argument '%s' is NULL", name));
}

}  // namespace

extern "C" {

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
    const braid::UniqueId id = Communicator::newUniqueId();
    std::vector<std::unique_ptr<ncclComm>> made(static_cast<size_t>(ndev));
    std::vector<std::function<void()>> jobs;
    for (int i = 0; i < ndev; ++i) {
      made[i] = std::make_unique<ncclComm>();
      made[i]->device = devlist ? devlist[i] : i;
      jobs.push_back([&, i] { made[i]->comm = Communicator::init(ndev, i, id); });
    }
    runTogether(jobs);
    for (int i = 0; i < ndev; ++i) comms[i] = made[i].release();
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
    for (ncclComm::Outstanding& pending : comm->outstanding) pending.work.wait();
    comm->outstanding.clear();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  const char* fn = "ncclCommDestroy";
  if (!comm) return ncclSuccess;
  return guarded(fn, [&] {
    for (ncclComm::Outstanding& pending : comm->outstanding) {
      try {
        pending.work.wait();
      } catch (const Error&) {
        // Reported through ncclCommGetAsyncError, if anyone asked.
      }
    }
    delete comm;
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  return guarded("ncclCommAbort", [&] {
    if (comm->initThread.joinable()) comm->initThread.join();
    if (comm->comm.valid()) comm->comm.abort();
    for (ncclComm::Outstanding& pending : comm->outstanding) {
      try {
        pending.work.wait();
      } catch (const Error&) {
        // Aborted, as asked.
      }
    }
    delete comm;
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  (void)comm, (void)revokeFlags;
  return failWith(ncclInvalidUsage,
                  "ncclCommRevoke: not supported by braid yet (ncclCommAbort stops a "
                  "communicator's work and frees it)");
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
    readConfig(config, child.get(), fn);
    Communicator* parent = &comm->comm;
    ncclComm* handle = child.get();
    if (tGroup.depth > 0) {  // made at ncclGroupEnd; a rank without a color then gets NULL
      handle->ready = false;
      *newcomm = child.release();
      tGroup.creations.push_back([=] {
        handle->comm = parent->split(color, key);
        handle->ready = true;
        if (!handle->comm.valid()) {
          *newcomm = nullptr;
          delete handle;
        }
      });
      return ncclSuccess;
    }
    // braid's split is collective: every rank takes part, also one that
    // asks for no color (it gets an empty handle).
    ncclResult_t result = create(handle, [=] { return parent->split(color, key); });
    if (handle->blocking && !handle->comm.valid()) {
      *newcomm = nullptr;  // NCCL_SPLIT_NOCOLOR
      return ncclSuccess;
    }
    *newcomm = child.release();
    return result;
  });
}

NCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                         int excludeRanksCount, ncclComm_t* newcomm,
                                         ncclConfig_t* config, int shrinkFlags) {
  (void)comm, (void)excludeRanksList, (void)excludeRanksCount, (void)newcomm, (void)config,
      (void)shrinkFlags;
  return failWith(ncclInvalidUsage,
                  "ncclCommShrink: not supported by braid yet: use ncclCommSplit on every rank "
                  "(excluded ranks with NCCL_SPLIT_NOCOLOR)");
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
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

NCCL_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  (void)comm;  // one message per thread, as NCCL keeps it
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
  if (comm->initThread.joinable()) comm->initThread.join();
  if (comm->initResult != ncclSuccess) {
    *asyncError = comm->initResult;
    tLastError = comm->initError;
    return ncclSuccess;
  }
  size_t kept = 0;
  for (ncclComm::Outstanding& pending : comm->outstanding) {
    if (!pending.work.test()) {
      comm->outstanding[kept++] = std::move(pending);
      continue;
    }
    try {
      pending.work.wait();
    } catch (const Error& error) {
      if (comm->asyncError == ncclSuccess) {
        comm->asyncError = resultOf(error.code());
        comm->asyncMessage = error.what();
      }
    }
  }
  comm->outstanding.resize(kept);
  if (comm->asyncError != ncclSuccess) {
    tLastError = comm->asyncMessage;
    *asyncError = comm->asyncError;
  } else {
    *asyncError = kept > 0 ? ncclInProgress : ncclSuccess;
  }
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return guarded("ncclCommCount", [&] {
    if (ncclResult_t bad = need(count, "ncclCommCount", "count")) return bad;
    *count = usable(comm, "ncclCommCount").comm.size();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded("ncclCommCuDevice", [&] {
    if (ncclResult_t bad = need(device, "ncclCommCuDevice", "device")) return bad;
    *device = usable(comm, "ncclCommCuDevice").device;
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded("ncclCommUserRank", [&] {
    if (ncclResult_t bad = need(rank, "ncclCommUserRank", "rank")) return bad;
    *rank = usable(comm, "ncclCommUserRank").comm.rank();
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", [&] {
    if (ncclResult_t bad = need(ptr, "ncclMemAlloc", "ptr")) return bad;
    *ptr = braid::memAlloc(size);
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  return guarded("ncclMemFree", [&] {
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
  (void)comm, (void)buff, (void)size, (void)win, (void)winFlags;
  return failWith(ncclInvalidUsage,
                  "ncclCommWindowRegister: symmetric memory windows are not supported by braid "
                  "yet");
}

NCCL_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)comm, (void)win;
  return failWith(ncclInvalidUsage,
                  "ncclCommWindowDeregister: symmetric memory windows are not supported by "
                  "braid yet");
}

NCCL_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                   ncclDataType_t datatype,
                                                   ncclScalarResidence_t residence,
                                                   ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (ncclResult_t bad = need(op, fn, "op")) return bad;
    if (ncclResult_t bad = need(scalar, fn, "scalar")) return bad;
    typeOf(datatype, fn);
    const int where = rawValue(residence);
    if (where != ncclScalarDevice && where != ncclScalarHostImmediate)
      return badArgument(fn, format("argument 'residence' is %d", where));
    ncclComm::PreMulSum custom;
    custom.live = true;
    custom.type = datatype;
    custom.immediate = residence == ncclScalarHostImmediate;
    if (custom.immediate)
      std::memcpy(custom.value.data(), scalar,
                  braid::dataTypeSize(static_cast<DataType>(datatype)));
    else
      custom.scalar = scalar;  // host memory here: read at each collective
    size_t index = 0;
    while (index < comm->redOps.size() && comm->redOps[index].live) ++index;
    if (index == comm->redOps.size()) comm->redOps.emplace_back();
    if (index > static_cast<size_t>(ncclMaxRedOp - ncclNumOps))
      return failWith(ncclInvalidUsage, format("%s: too many operators", fn));
    comm->redOps[index] = custom;
    *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(index));
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const char* fn = "ncclRedOpDestroy";
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  const int value = rawValue(op);
  const size_t index = static_cast<size_t>(value - ncclNumOps);
  if (value < ncclNumOps || index >= comm->redOps.size() || !comm->redOps[index].live)
    return badArgument(fn, format("argument 'op' is %d, not an operator made by "
                                  "ncclRedOpCreatePreMulSum on this communicator",
                                  value));
  comm->redOps[index].live = false;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t) {
  const char* fn = "ncclAllReduce";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const Reduction reduction = reductionOf(c, op, datatype, fn);
    std::shared_ptr<std::vector<std::byte>> scratch;
    const void* input = reductionInput(reduction, sendbuff, count, datatype, &scratch);
    Work work = c.comm.allReduce(input, recvbuff, count, type, reduction.op, streamFor(&c));
    return issued(c, std::move(work), std::move(scratch));
  });
}

NCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t) {
  const char* fn = "ncclReduce";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const Reduction reduction = reductionOf(c, op, datatype, fn);
    std::shared_ptr<std::vector<std::byte>> scratch;
    const void* input = reductionInput(reduction, sendbuff, count, datatype, &scratch);
    Work work = c.comm.reduce(input, recvbuff, count, type, reduction.op, root, streamFor(&c));
    return issued(c, std::move(work), std::move(scratch));
  });
}

NCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t) {
  const char* fn = "ncclBroadcast";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.broadcast(sendbuff, recvbuff, count, type, root, streamFor(&c)));
  });
}

NCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t op,
                                            ncclComm_t comm, cudaStream_t) {
  const char* fn = "ncclReduceScatter";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const Reduction reduction = reductionOf(c, op, datatype, fn);
    std::shared_ptr<std::vector<std::byte>> scratch;
    const size_t total = recvcount * static_cast<size_t>(c.comm.size());
    const void* input = reductionInput(reduction, sendbuff, total, datatype, &scratch);
    Work work = c.comm.reduceScatter(input, recvbuff, recvcount, type, reduction.op, streamFor(&c));
    return issued(c, std::move(work), std::move(scratch));
  });
}

NCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t) {
  const char* fn = "ncclAllGather";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.allGather(sendbuff, recvbuff, sendcount, type, streamFor(&c)));
  });
}

NCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t) {
  const char* fn = "ncclSend";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.send(sendbuff, count, type, peer, streamFor(&c)));
  });
}

NCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclComm_t comm, cudaStream_t) {
  const char* fn = "ncclRecv";
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.recv(recvbuff, count, type, peer, streamFor(&c)));
  });
}

}  // extern "C"

namespace {

// An exchange of point-to-point pieces run as one group: AlltoAll, Gather
// and Scatter. `sendTo(p)` and `recvFrom(p)` give each peer's piece (null:
// none).
ncclResult_t exchange(const char* fn, ncclComm_t comm, ncclDataType_t datatype, size_t count,
                      const std::function<const void*(int)>& sendTo,
                      const std::function<void*(int)>& recvFrom) {
  return guarded(fn, [&] {
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const int n = c.comm.size();
    const bool ownGroup = tGroup.depth == 0;
    if (ownGroup) c.comm.groupStart();
    std::vector<Work> works;
    try {
      for (int p = 0; p < n; ++p) {
        if (const void* piece = sendTo(p))
          works.push_back(c.comm.send(piece, count, type, p, streamFor(&c)));
        if (void* piece = recvFrom(p))
          works.push_back(c.comm.recv(piece, count, type, p, streamFor(&c)));
      }
    } catch (...) {
      if (ownGroup) c.comm.groupEnd();  // runs the pieces already issued: peers expect them
      throw;
    }
    if (ownGroup) c.comm.groupEnd();
    ncclResult_t result = ncclSuccess;
    for (Work& work : works) result = issued(c, std::move(work));
    return result;
  });
}

// Element `index * count` of `base` in `type`.
template <typename Pointer>
Pointer pieceOf(Pointer base, int index, size_t count, ncclDataType_t type) {
  const size_t bytes = count * braid::dataTypeSize(static_cast<DataType>(type));
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const std::byte,
                                  std::byte>;
  return reinterpret_cast<Pointer>(reinterpret_cast<Byte*>(base) +
                                   static_cast<size_t>(index) * bytes);
}

}  // namespace

extern "C" {

NCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t) {
  const char* fn = "ncclAlltoAll";
  if (!sendbuff && count > 0) return badArgument(fn, "argument 'sendbuff' is NULL");
  if (!recvbuff && count > 0) return badArgument(fn, "argument 'recvbuff' is NULL");
  return exchange(
      fn, comm, datatype, count, [&](int p) { return pieceOf(sendbuff, p, count, datatype); },
      [&](int p) { return pieceOf(recvbuff, p, count, datatype); });
}

NCCL_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t) {
  const char* fn = "ncclGather";
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  return guarded(fn, [&] {
    const int rank = usable(comm, fn).comm.rank(), n = comm->comm.size();
    if (root < 0 || root >= n)
      return badArgument(fn, format("argument 'root' is %d, not in [0, %d)", root, n));
    if (!sendbuff && count > 0) return badArgument(fn, "argument 'sendbuff' is NULL");
    if (rank == root && !recvbuff && count > 0)
      return badArgument(fn, "argument 'recvbuff' is NULL");
    return exchange(
        fn, comm, datatype, count,
        [&](int p) -> const void* { return p == root ? sendbuff : nullptr; },
        [&](int p) -> void* {
          return rank == root ? pieceOf(recvbuff, p, count, datatype) : nullptr;
        });
  });
}

NCCL_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t) {
  const char* fn = "ncclScatter";
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  return guarded(fn, [&] {
    const int rank = usable(comm, fn).comm.rank(), n = comm->comm.size();
    if (root < 0 || root >= n)
      return badArgument(fn, format("argument 'root' is %d, not in [0, %d)", root, n));
    if (rank == root && !sendbuff && count > 0)
      return badArgument(fn, "argument 'sendbuff' is NULL");
    if (!recvbuff && count > 0) return badArgument(fn, "argument 'recvbuff' is NULL");
    return exchange(
        fn, comm, datatype, count,
        [&](int p) -> const void* {
          return rank == root ? pieceOf(sendbuff, p, count, datatype) : nullptr;
        },
        [&](int p) -> void* { return p == root ? recvbuff : nullptr; });
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
    if (!group.creations.empty() && !group.comms.empty())
      return failWith(ncclInvalidUsage,
                      "ncclGroupEnd: a group may make communicators or run operations, not both");
    if (!group.creations.empty()) {
      runTogether(group.creations);
      return ncclSuccess;
    }
    // Each communicator's braid group; several run at once (one process
    // may drive several ranks), a nonblocking one in the background.
    std::vector<std::function<void()>> ends;
    bool pending = false;
    for (ncclComm* comm : group.comms) {
      ends.push_back([comm] { comm->comm.groupEnd(); });
      if (!comm->blocking) pending = true;
    }
    runTogether(ends);
    return pending ? ncclInProgress : ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return failWith(ncclInvalidUsage,
                  "ncclGroupSimulateEnd: not supported by braid yet (braid-sim predicts "
                  "collective times from the command line)");
}

}  // extern "C"

// (GCC finds some targets cannot throw and would like the aliases to say so.)
#pragma GCC diagnostic ignored "-Wmissing-attributes"
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
NCCL_ALIAS(ncclResult_t, RedOpCreatePreMulSum,
           (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
            ncclScalarResidence_t residence, ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, RedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, AllReduce,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Reduce,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Broadcast,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Bcast,
           (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
            cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, ReduceScatter,
           (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, AllGather,
           (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, AlltoAll,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Gather,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Scatter,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Send,
           (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
            cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Recv,
           (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
            cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, GroupStart, ());
NCCL_ALIAS(ncclResult_t, GroupEnd, ());
NCCL_ALIAS(ncclResult_t, GroupSimulateEnd, (ncclSimInfo_t * simInfo));
