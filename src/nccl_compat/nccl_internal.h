// Internal to libnccl.so.2: the communicator handle, this thread's group,
// and the helpers both halves of the C API use (nccl_comm.cc: communicators
// and groups; nccl_collectives.cc: operators and collectives).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "braid/braid.h"
#include "braid/nccl/nccl.h"
#include "core/errors.h"
#include "device/device.h"

#define NCCL_EXPORT __attribute__((visibility("default")))
// Makes ncclNAME a weak alias of pncclNAME, which must be defined in the same
// file (a profiler may interpose the first).
#define NCCL_ALIAS(ret, name, args) \
  extern "C" NCCL_EXPORT ret nccl##name args __attribute__((weak, alias("pnccl" #name)))

namespace braid::nccl {

using braid::Communicator;
using braid::DataType;
using braid::Error;
using braid::ErrorCode;
using braid::format;
using braid::ReduceOp;
using braid::Stream;
using braid::Work;

// The ncclResult_t for a braid error code.
ncclResult_t resultOf(ErrorCode code);
// Keeps `message` for ncclGetLastError (per thread) and returns `result`.
ncclResult_t failWith(ncclResult_t result, std::string message);
// A bad argument of function `fn`: ncclInvalidArgument.
ncclResult_t badArgument(const char* fn, const std::string& what);

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

// ncclSuccess when `pointer` is set, else the error naming argument `name`.
template <typename T>
ncclResult_t need(T* pointer, const char* fn, const char* name) {
  return pointer ? ncclSuccess : badArgument(fn, format("argument '%s' is NULL", name));
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

}  // namespace braid::nccl

// A symmetric window's handle (ncclWindow_t).
struct ncclWindow_vidmem {
  ncclComm* comm = nullptr;
  void* user = nullptr;  // the buffer registered (ncclWinGetUserPtr)
  braid::Window window;  // filled at ncclGroupEnd for one registered in a group
};

// A communicator handle. `comm` is set once the communicator exists: at
// once for a blocking init outside a group, at ncclGroupEnd inside one, on
// the init thread for a nonblocking one.
struct ncclComm {
  braid::Communicator comm;
  int device = -1;
  bool blocking = true;
  std::string name;
  std::atomic<bool> revoked{false};  // ncclCommRevoke was called
  // One-sided calls: contexts (config numRmaCtx) and signal indices per
  // context (numRmaSig); context c's index s is braid's signal c * rmaSignals + s.
  int rmaContexts = 1;
  int rmaSignals = 1;
  // A window of device memory was registered: ncclSignal and ncclWaitSignal
  // then act on the device windows' signals, ordered on their stream.
  bool deviceWindows = false;
  static constexpr int kMaxRmaSignals = braid::kSignals;

  // A nonblocking init runs on `initThread`; `ready` says it has finished,
  // `initResult` how.
  std::thread initThread;
  std::atomic<bool> ready{true};
  ncclResult_t initResult = ncclSuccess;
  std::string initError;

  // Work issued on the progress thread and not yet seen complete, with the
  // scratch it reads (a pre-multiplied input).
  struct Outstanding {
    braid::Work work;
    std::shared_ptr<std::vector<std::byte>> scratch;
  };
  // Guards `outstanding`, `asyncError`, `asyncMessage` and joining
  // `initThread`: ncclCommGetAsyncError and ncclCommAbort may come from
  // another thread (a watchdog) while this one issues work.
  std::mutex mutex;
  std::vector<Outstanding> outstanding;
  ncclResult_t asyncError = ncclSuccess;  // the first error of work that ran in the background
  std::string asyncMessage;
  std::atomic<int> calls{0};  // calls inside this communicator now (see InCall)

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
    joinInit();
    for (Registration* registration : registrations) delete registration;
  }

  // Makes the communicator with `make`, then sets `ready`. A failure becomes
  // the handle's (initResult and initError, which later calls report) and is
  // returned too.
  std::exception_ptr build(const std::function<braid::Communicator()>& make);

  braid::ErrorCode initCode = braid::ErrorCode::InvalidUsage;  // when initResult is an error

  void joinInit() {
    std::lock_guard<std::mutex> lock(mutex);
    if (initThread.joinable()) initThread.join();
  }

  // Waits for a nonblocking init; its failure is the communicator's.
  void waitReady() {
    joinInit();
    if (initResult != ncclSuccess) throw braid::Error(initCode, initError);
  }

  // Keeps background work (and its scratch) until it is seen done; forgets
  // what finished already, keeping its first error.
  void keep(Outstanding work);
  // ncclInProgress while background work is outstanding, then ncclSuccess
  // or the first error (its message in *message).
  ncclResult_t poll(std::string* message);
  // Waits for every outstanding op, ignoring their errors (the caller is
  // ending the communicator; ncclCommGetAsyncError reported them, if asked).
  void drain();

 private:
  void forgetFinished();  // REQUIRES: mutex held
};

namespace braid::nccl {

// This thread's open group.
struct Group {
  int depth = 0;
  std::vector<ncclComm*> comms;                  // communicators with calls in it, first use first
  std::vector<std::function<void()>> creations;  // inits and splits, run at ncclGroupEnd
  std::vector<ncclComm::Outstanding> scratch;    // what the group's ops read, kept until it ends
};
// This thread's open group (ncclGroupStart to the matching ncclGroupEnd).
Group& openGroup();

// Where a call runs: on `stream` when its buffers are device memory (the
// first non-null of `buffers` decides; the communicator rejects a mix),
// else on the host, in this thread or, for a nonblocking communicator, on
// the progress thread.
inline Stream streamFor(const ncclComm* comm, cudaStream_t stream,
                        std::initializer_list<const void*> buffers) {
  if (braid::device::Device* device = braid::device::current())
    for (const void* buffer : buffers)
      if (buffer) {
        if (device->deviceOf(buffer) >= 0) return Stream::cuda(static_cast<void*>(stream));
        break;
      }
  return comm->blocking ? Stream() : Stream::async();
}

// The communicator behind a handle, ready for a call of `fn`; inside a
// group, its calls gather in a braid group from here on (unless `joinGroup`
// is false: a query).
ncclComm& usable(ncclComm* comm, const char* fn, bool joinGroup = true);

// Counts a call inside a communicator, so that ncclCommAbort from another
// thread frees it only once the call has left.
class InCall {
 public:
  explicit InCall(ncclComm* comm) : comm_(comm) {
    if (comm_) ++comm_->calls;
  }
  ~InCall() {
    if (comm_) --comm_->calls;
  }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;

 private:
  ncclComm* comm_;
};

// Result of an op just issued: a nonblocking communicator keeps its work
// (and the scratch it reads) until ncclCommGetAsyncError sees it done.
ncclResult_t issued(ncclComm& comm, Work work,
                    std::shared_ptr<std::vector<std::byte>> scratch = nullptr);

// braid's DataType for an ncclDataType_t, or InvalidArgument naming `fn`.
DataType typeOf(const ncclDataType_t& type, const char* fn);

}  // namespace braid::nccl
