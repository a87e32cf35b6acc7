// Streams, events, graphs, and the copies, reductions and flag operations
// enqueued on streams (streams.h).
//
// Threading: no state here; see streams.h.
#include "device/cuda/streams.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "braid/error.h"
#include "core/errors.h"
#include "device/cuda/kernels.h"

namespace braid::device::cuda {
namespace {

// Operations per cuStreamBatchMemOp call (the driver takes fewer than 256);
// a longer flagOps() batch is several calls in a row, in order.
constexpr size_t kBatchOps = 64;

CUstreamBatchMemOpParams memOpOf(const FlagOp& op) {
  CUstreamBatchMemOpParams params;
  std::memset(&params, 0, sizeof params);
  if (op.kind == FlagOp::Kind::Write) {
    params.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    params.writeValue.address = addressOf(op.flag);
    params.writeValue.value = op.value;
    // Default: a system-scope fence first, so the work enqueued before the
    // write has landed, for every process, when the flag changes.
    params.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  } else {
    params.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    params.waitValue.address = addressOf(op.flag);
    params.waitValue.value = op.value;
    // GEQ is the cyclic (int32_t)(*flag - value) >= 0 of device::passes().
    params.waitValue.flags =
        op.compare == Compare::Equal ? CU_STREAM_WAIT_VALUE_EQ : CU_STREAM_WAIT_VALUE_GEQ;
  }
  return params;
}

}  // namespace

// ---- Streams and events.

StreamHandle Streams::createStream(int device) {
  contexts_.checkDevice(device, "createStream");
  ContextScope scope(contexts_, device);
  cudaStream_t stream = nullptr;
  if (const cudaError_t rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      rc != cudaSuccess)
    fail(rc, format("cudaStreamCreateWithFlags(non-blocking, device %d)", device));
  return stream;
}

void Streams::destroyStream(StreamHandle stream) {
  const RelaxedCapture relaxed;
  if (const cudaError_t rc = cudaStreamDestroy(streamOf(stream)); rc != cudaSuccess)
    fail(rc, format("cudaStreamDestroy(%p)", stream));
}

void Streams::synchronize(StreamHandle stream) {
  const RelaxedCapture relaxed;
  if (const cudaError_t rc = cudaStreamSynchronize(streamOf(stream)); rc != cudaSuccess)
    fail(rc, format("cudaStreamSynchronize(%p)", stream));
}

// The event belongs to `device`: record it on that device's streams (any
// stream may wait for it).
EventHandle Streams::createEvent(int device) {
  contexts_.checkDevice(device, "createEvent");
  ContextScope scope(contexts_, device);
  cudaEvent_t event = nullptr;
  if (const cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      rc != cudaSuccess)
    fail(rc, "cudaEventCreateWithFlags(disable timing)");
  return event;
}

void Streams::destroyEvent(EventHandle event) {
  const RelaxedCapture relaxed;
  if (const cudaError_t rc = cudaEventDestroy(eventOf(event)); rc != cudaSuccess)
    fail(rc, format("cudaEventDestroy(%p)", event));
}

void Streams::record(EventHandle event, StreamHandle stream) {
  const RelaxedCapture relaxed;
  if (const cudaError_t rc = cudaEventRecord(eventOf(event), streamOf(stream)); rc != cudaSuccess)
    fail(rc, format("cudaEventRecord(event %p, stream %p)", event, stream));
}

void Streams::streamWait(StreamHandle stream, EventHandle event) {
  const RelaxedCapture relaxed;
  if (const cudaError_t rc = cudaStreamWaitEvent(streamOf(stream), eventOf(event), 0);
      rc != cudaSuccess)
    fail(rc, format("cudaStreamWaitEvent(stream %p, event %p)", stream, event));
}

bool Streams::query(EventHandle event) {
  const RelaxedCapture relaxed;  // the watchdog asks while a user's thread may capture
  const cudaError_t rc = cudaEventQuery(eventOf(event));
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) fail(rc, format("cudaEventQuery(%p)", event));
  static_cast<void>(cudaGetLastError());  // "not ready" is an answer, not a launch's error
  return false;
}

bool Streams::capturing(StreamHandle stream) {
  const RelaxedCapture relaxed;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (const cudaError_t rc = cudaStreamIsCapturing(streamOf(stream), &status); rc != cudaSuccess)
    fail(rc, format("cudaStreamIsCapturing(%p)", stream));
  return status != cudaStreamCaptureStatusNone;
}

// ---- Graphs.

void Streams::beginCapture(StreamHandle stream) {
  ContextScope scope(contexts_, contexts_.deviceOfStream(stream));
  if (const cudaError_t rc =
          cudaStreamBeginCapture(streamOf(stream), cudaStreamCaptureModeThreadLocal);
      rc != cudaSuccess)
    fail(rc, format("cudaStreamBeginCapture(%p)", stream));
}

GraphHandle Streams::endCapture(StreamHandle stream) {
  ContextScope scope(contexts_, contexts_.deviceOfStream(stream));
  cudaGraph_t graph = nullptr;
  if (const cudaError_t rc = cudaStreamEndCapture(streamOf(stream), &graph); rc != cudaSuccess)
    fail(rc, format("cudaStreamEndCapture(%p)", stream));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t rc = cudaGraphInstantiate(&exec, graph, 0);
  static_cast<void>(cudaGraphDestroy(graph));  // the instance keeps what it needs
  if (rc != cudaSuccess) fail(rc, "cudaGraphInstantiate");
  return exec;
}

void Streams::launchGraph(GraphHandle graph, StreamHandle stream) {
  const RelaxedCapture relaxed;
  ContextScope scope(contexts_, contexts_.deviceOfStream(stream));
  if (const cudaError_t rc = cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), streamOf(stream));
      rc != cudaSuccess)
    fail(rc, format("cudaGraphLaunch(%p, %p)", graph, stream));
}

void Streams::destroyGraph(GraphHandle graph) {
  const RelaxedCapture relaxed;
  if (const cudaError_t rc = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
      rc != cudaSuccess)
    fail(rc, format("cudaGraphExecDestroy(%p)", graph));
}

// ---- Stream-ordered operations.
//
// Hot path: no allocation; a cached deviceOf() per pointer (one lock each),
// the stream's device (its context's) and a context check per call.

// braid's copy kernel where both sides are device memory the stream's
// device reaches; the copy engines (cudaMemcpyAsync) where host memory is
// involved or the two devices have no peer access.
void Streams::copy(StreamHandle stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const int device = contexts_.deviceOfStream(stream);
  const int to = memory_.deviceOf(dst);
  const int from = memory_.deviceOf(src);
  ContextScope scope(contexts_, device);
  if (to >= 0 && from >= 0 && contexts_.reaches(device, to) && contexts_.reaches(device, from)) {
    if (const int rc = launchCopy(stream, dst, src, bytes, contexts_.smCount(device)); rc != 0)
      fail(static_cast<cudaError_t>(rc),
           format("copy kernel (%zu bytes from %p on device %d to %p on device %d, stream of "
                  "device %d)",
                  bytes, src, from, dst, to, device));
    return;
  }
  if (const cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, streamOf(stream));
      rc != cudaSuccess)
    fail(rc, format("cudaMemcpyAsync(%zu bytes from %p to %p, stream of device %d)", bytes, src,
                    dst, device));
}

void Streams::reduce(StreamHandle stream, const ReduceArgs& args) {
  checkReduce(args);
  if (args.count == 0) return;
  const int device = contexts_.deviceOfStream(stream);
  checkReach(device, args.dst);
  for (int i = 0; i < args.inputs; ++i) checkReach(device, args.srcs[i]);
  ContextScope scope(contexts_, device);
  if (const int rc = launchReduce(stream, args, contexts_.smCount(device)); rc != 0)
    fail(static_cast<cudaError_t>(rc),
         format("reduce kernel (%d inputs, %zu x %s, %s, device %d)", args.inputs, args.count,
                dataTypeName(args.type), reduceOpName(args.op), device));
}

// Stream memory operations are always available from CUDA 12 on (the v2
// API; CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 is gone), so a batch is
// always one cuStreamBatchMemOp per kBatchOps operations.
void Streams::flagOps(StreamHandle stream, const FlagOp* ops, size_t count) {
  if (count == 0) return;
  const int device = contexts_.deviceOfStream(stream);
  ContextScope scope(contexts_, device);
  if (std::any_of(ops, ops + count, [](const FlagOp& op) { return op.polled(); })) {
    if (const int rc = launchPolledFlags(stream, ops, count); rc != 0)
      fail(static_cast<cudaError_t>(rc),
           format("polled flag operations (%zu, stream %p of device %d)", count, stream, device));
    return;
  }
  const Driver& driver = contexts_.driver();
  CUstreamBatchMemOpParams batch[kBatchOps];
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kBatchOps);
    for (size_t i = 0; i < n; ++i) batch[i] = memOpOf(ops[done + i]);
    const CUresult rc =
        driver.streamBatchMemOp(streamOf(stream), static_cast<unsigned>(n), batch, 0);
    if (rc != CUDA_SUCCESS)
      fail(driver, rc,
           format("cuStreamBatchMemOp(%zu of %zu flag operations, stream %p of device %d)", n,
                  count, stream, device));
    done += n;
  }
}

// ---- From the host, now: on the flag's device's private stream, which
// never waits on anything, so a stream blocked on this very flag does not
// hold the write up. (The streams of a device share its hardware queues,
// CUDA_DEVICE_MAX_CONNECTIONS of them, 8 unless set: with more busy streams
// than queues, a blocked one can delay work queued behind it, this stream's
// included.) Not for hot paths: a stream synchronize each. Flags in host
// memory (registered or not) are read and written directly.

void Streams::writeFlagNow(uint32_t* flag, uint32_t value) {
  const int device = memory_.deviceOf(flag);
  if (device < 0) {
    __atomic_store_n(flag, value, __ATOMIC_SEQ_CST);
    return;
  }
  ContextScope scope(contexts_, device);
  cudaStream_t stream = contexts_.privateStream(device);
  const Driver& driver = contexts_.driver();
  const CUresult rc =
      driver.streamWriteValue32(stream, addressOf(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (rc != CUDA_SUCCESS)
    fail(driver, rc,
         format("writeFlagNow(%p, %u, device %d): cuStreamWriteValue32", static_cast<void*>(flag),
                value, device));
  finishPrivate(stream, device, "writeFlagNow");
}

uint32_t Streams::readFlagNow(const uint32_t* flag) {
  const int device = memory_.deviceOf(flag);
  if (device < 0) return __atomic_load_n(flag, __ATOMIC_SEQ_CST);
  uint32_t value = 0;
  transferNow(device, &value, flag, sizeof value, Pageable::Dst, "readFlagNow");
  return value;
}

void Streams::copyNow(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  int device = memory_.deviceOf(dst);
  if (device < 0) device = memory_.deviceOf(src);
  if (device < 0) {
    std::memmove(dst, src, bytes);
    return;
  }
  const Pageable pageable = memory_.deviceOf(dst) < 0 && !memory_.pageLocked(dst) ? Pageable::Dst
                            : memory_.deviceOf(src) < 0 && !memory_.pageLocked(src)
                                ? Pageable::Src
                                : Pageable::None;
  transferNow(device, dst, src, bytes, pageable, "copyNow");
}

void Streams::checkReduce(const ReduceArgs& args) {
  if (args.inputs < 1 || args.inputs > kMaxReduceInputs)
    throw Error(
        ErrorCode::InvalidArgument,
        format("braid: cuda device: reduce of %d inputs (1 to %d)", args.inputs, kMaxReduceInputs));
  if (!isValid(args.type) || !isValid(args.op))
    throw Error(ErrorCode::InvalidArgument, "braid: cuda device: reduce: bad type or op");
}

// A kernel of `device` touching `pointer` must be able to: its own memory, a
// peer's with peer access, or page-locked host memory (or any host memory
// where the GPU reads pageable memory: HMM, ATS). Anything else would end
// the context with an illegal address, so it is refused first (copy()
// routes such memory to cudaMemcpyAsync instead).
void Streams::checkReach(int device, const void* pointer) {
  const int other = memory_.deviceOf(pointer);
  if (other < 0) {
    if (memory_.pageLocked(pointer) || contexts_.readsPageableMemory(device)) return;
    throw Error(ErrorCode::InvalidArgument,
                format("braid: cuda device: reduce on a stream of device %d: %p is host memory "
                       "that is not page-locked, which a kernel cannot touch: register it "
                       "(cudaHostRegister) or copy it into device memory",
                       device, pointer));
  }
  if (contexts_.reaches(device, other)) return;
  throw Error(ErrorCode::InvalidArgument,
              format("braid: cuda device: reduce on a stream of device %d: %p is memory of "
                     "device %d, which device %d has no peer access to",
                     device, pointer, other, device));
}

// Copies on `device`'s private stream and waits, at most kPrivateWait for
// each piece. A copy between device memory and pageable host memory would
// return only once done, however long the device takes to run it (a copy
// to pageable memory is synchronous), so such a copy goes through the
// device's page-locked bounce buffer in pieces: each is an asynchronous
// copy that finishPrivate() waits for with its deadline. A piece that
// missed its deadline may still land in the bounce buffer later; the next
// user's copies queue behind it on the same stream, so it never overwrites
// theirs.
void Streams::transferNow(int device, void* dst, const void* src, size_t bytes, Pageable pageable,
                          const char* what) {
  ContextScope scope(contexts_, device);
  cudaStream_t stream = contexts_.privateStream(device);
  auto copy = [&](void* to, const void* from, size_t n) {
    const cudaError_t rc = cudaMemcpyAsync(to, from, n, cudaMemcpyDefault, stream);
    if (rc != cudaSuccess)
      fail(rc, format("%s(%zu bytes from %p to %p, device %d): cudaMemcpyAsync", what, n, from, to,
                      device));
  };
  if (pageable == Pageable::None) {
    copy(dst, src, bytes);
    finishPrivate(stream, device, what);
    return;
  }
  std::lock_guard<std::mutex> lock(contexts_.bounceMutex(device));
  std::byte* bounce = contexts_.bounce(device);
  auto* to = static_cast<std::byte*>(dst);
  const auto* from = static_cast<const std::byte*>(src);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, Contexts::kBounceBytes);
    if (pageable == Pageable::Src) {
      std::memcpy(bounce, from + done, n);
      copy(to + done, bounce, n);
      finishPrivate(stream, device, what);
    } else {
      copy(bounce, from + done, n);
      finishPrivate(stream, device, what);
      std::memcpy(to + done, bounce, n);
    }
    done += n;
  }
}

// Waits for the private stream, at most kPrivateWait: the device may
// schedule it behind streams blocked on flag waits (the hardware has a
// bounded number of queues), and the watchdog that calls this to release
// them must never hang with them.
void Streams::finishPrivate(cudaStream_t stream, int device, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + kPrivateWait;
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(stream);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) fail(rc, format("%s (device %d): cudaStreamQuery", what, device));
    static_cast<void>(cudaGetLastError());
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(
          ErrorCode::SystemError,
          format("braid: cuda device: %s (device %d) did not run within %lld s: more "
                 "streams may wait on flags than the device has queues (raise "
                 "CUDA_DEVICE_MAX_CONNECTIONS)",
                 what, device,
                 static_cast<long long>(
                     std::chrono::duration_cast<std::chrono::seconds>(kPrivateWait).count())));
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace braid::device::cuda
