// The device seam: the only door to a GPU, as LevelDB's Env is the only
// door to the OS. Everything braid does with device memory goes through a
// Device: memory (allocate, export as a file descriptor, import and map,
// classify a pointer), streams and events, and the stream-ordered
// operations the device executor lowers plans to (copy, n-input reduce,
// flag writes and flag waits, batched).
//
// Two implementations: cuda/ (the CUDA runtime plus the driver's cuMem and
// stream memory operations) and emulated/ (a device made of host memory:
// memfd-backed allocations, a stream is an in-order worker thread). Which
// one a process uses is chosen once, by BRAID_DEVICE (see current()).
//
// Stream-ordered operations are enqueued and return at once; they run in
// issue order per stream. No operation here ever spins on the device for a
// peer: a flag wait is a stream memory operation (cuStreamWaitValue32) or,
// emulated, a futex wait on the worker thread.
//
// Threading: every method may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "braid/types.h"

namespace braid::device {

// Opaque handles: a cudaStream_t / cudaEvent_t / cudaGraphExec_t, or the
// emulated device's own.
using StreamHandle = void*;
using EventHandle = void*;
using GraphHandle = void*;

// A flag wait compares 32-bit counters cyclically, as cuStreamWaitValue32
// does: GreaterOrEqual passes once (int32_t)(*flag - value) >= 0, so
// counters may wrap. Equal passes once *flag == value.
enum class Compare : uint8_t { GreaterOrEqual, Equal };

// One stream memory operation of a batch (Device::flagOps).
//
// With a `base`, the value is relative: the operation uses *base + value,
// read when it runs. That is how work captured into a graph counts: its
// counters live in device memory and advance on every replay (Add), where
// an absolute value would be baked into the graph. A batch with a relative
// operation, an Add or an abort word runs as a kernel that polls for its
// waits (stream memory operations take constants only); one without runs
// as stream memory operations, which never occupy the device while they
// wait.
struct FlagOp {
  enum class Kind : uint8_t { Write, Wait, Add };
  Kind kind = Kind::Write;
  Compare compare = Compare::GreaterOrEqual;  // for waits
  uint32_t* flag = nullptr;                   // in device memory of this process (own or imported)
  uint32_t value = 0;
  const uint32_t* base = nullptr;  // non-null: relative to *base (device memory of this process)
  // Non-null, for a wait: it also ends once *abort is not 0 (how a failed
  // communicator releases graph replays, which no host counter describes).
  const uint32_t* abort = nullptr;

  static FlagOp write(uint32_t* flag, uint32_t value, const uint32_t* base = nullptr) {
    return {Kind::Write, Compare::GreaterOrEqual, flag, value, base, nullptr};
  }
  static FlagOp wait(uint32_t* flag, uint32_t value, Compare compare = Compare::GreaterOrEqual,
                     const uint32_t* base = nullptr) {
    return {Kind::Wait, compare, flag, value, base, nullptr};
  }
  // *counter += value (wrapping); no other process writes `counter`.
  static FlagOp add(uint32_t* counter, uint32_t value) {
    return {Kind::Add, Compare::GreaterOrEqual, counter, value, nullptr, nullptr};
  }
  bool polled() const { return base != nullptr || abort != nullptr || kind == Kind::Add; }
};

// dst = srcs[0] op srcs[1] op ... op srcs[n-1], elementwise over `count`
// elements, combined in that order. Narrow floats (fp16, bf16, fp8)
// accumulate in fp32 and round once at the end; for n = 2 the result is
// bit for bit braid's host kernel (reduce::kernelFor) on (srcs[0], srcs[1]).
// With `finalizeDivisor` >= 1 and op Avg, the result is then divided as
// reduce::finalize does; 0 skips that. n = 1 is a copy (plus the divide).
// dst may alias a source exactly. REQUIRES: 1 <= n <= kMaxReduceInputs.
inline constexpr int kMaxReduceInputs = 8;
struct ReduceArgs {
  void* dst = nullptr;
  const void* srcs[kMaxReduceInputs] = {};
  int inputs = 0;
  size_t count = 0;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int finalizeDivisor = 0;
};

// What a device is and can do, read once when the Device is made
// (Device::properties): what paths between ranks are chosen by, and what
// braid-info --device prints.
struct Properties {
  std::string name;  // "NVIDIA H200", "emulated GPU 1"
  // The GPU's own identity: the same in every process, whatever device
  // number it has there (CUDA_VISIBLE_DEVICES renumbers the devices a
  // process sees, so two processes' device 0 may be two GPUs).
  std::array<uint8_t, 16> uuid{};
  std::string busId;          // PCI "0000:19:00.0"; "" where there is none
  int computeCapability = 0;  // 90 for sm_90; 0 for the emulated device
  int multiprocessors = 0;
  // Virtual memory management (cuMemCreate, cuMemMap). Without it,
  // allocate() falls back to memory no other process can map.
  bool virtualMemory = false;
  // exportFd() works for allocate()'s memory (cuMem POSIX-fd handles).
  // Without them, FIFOs to other processes are staged through host memory.
  bool fdHandles = false;
  bool dmabuf = false;                // exportDmabuf() can give NICs its memory
  bool rdmaWithVmm = false;           // GPUDirect RDMA with cuMem memory
  bool unifiedAddressing = false;     // one address space with the host
  bool pageableMemoryAccess = false;  // kernels touch pageable host memory (HMM, ATS)
};

// A GPU's UUID as nvidia-smi prints it ("GPU-" and 32 hex digits in groups).
std::string uuidText(const std::array<uint8_t, 16>& uuid);

class Device {
 public:
  virtual ~Device() = default;

  // "cuda" or "emulated".
  virtual const char* name() const = 0;
  // Devices this process can use, and the calling thread's current one.
  virtual int count() const = 0;
  virtual int current() const = 0;
  // Makes `device` current for the calling thread (cudaSetDevice).
  virtual void setCurrent(int device) = 0;
  // Whether kernels on `device` can read and write memory of `peer`
  // (NVLink or PCIe peer access); every device reaches itself.
  virtual bool canAccessPeer(int device, int peer) const = 0;
  // What `device` is and can do (fixed). REQUIRES: 0 <= device < count().
  virtual const Properties& properties(int device) const = 0;
  // The driver's CUDA version as major * 1000 + minor * 10 (13000 for
  // 13.0); 0 for the emulated device.
  virtual int driverVersion() const = 0;
  // The device of this process whose GPU has `uuid`, or -1 where this
  // process does not see that GPU.
  int deviceWithUuid(const std::array<uint8_t, 16>& uuid) const {
    for (int d = 0; d < count(); ++d)
      if (properties(d).uuid == uuid) return d;
    return -1;
  }

  // ---- Memory.
  // `bytes` of device memory on `device` that same-host processes can map
  // (exportFd), zero-filled. Throws Error(SystemError) naming the size and
  // the device when it cannot.
  virtual void* allocate(int device, size_t bytes) = 0;
  // Frees memory from allocate() or allocateHost(). No enqueued operation
  // may still use it.
  virtual void free(void* base) = 0;
  // A new file descriptor for the allocation at `base` (the caller owns
  // it), for another process's import(). Throws Error(SystemError).
  virtual int exportFd(const void* base) = 0;
  // Maps another process's allocation of `bytes` (its exported fd) into
  // this process, usable by `device`. The fd stays the caller's. Throws
  // Error(SystemError).
  virtual void* import(int fd, size_t bytes, int device) = 0;
  // Unmaps memory from import() or importHost().
  virtual void unimport(void* base, size_t bytes) = 0;
  // `bytes` of zero-filled, page-locked host memory that kernels and
  // stream memory operations of every device of this process can use,
  // exported and freed like allocate()'s (exportFd, free): where two GPUs
  // have no peer access, the FIFOs between them are staged here. deviceOf()
  // calls it host memory (-1). Throws Error(SystemError).
  virtual void* allocateHost(size_t bytes) = 0;
  // Maps another process's allocateHost() memory (its exported fd) the
  // same way. The fd stays the caller's. Throws Error(SystemError).
  virtual void* importHost(int fd, size_t bytes) = 0;
  // A dma-buf file descriptor (the caller owns it) for the `bytes` at
  // `base`, memory from allocate(): what a NIC registers for GPUDirect
  // RDMA (ibv_reg_dmabuf_mr). `*offset` is where `base` lies in it.
  // Returns -1, with `*whyNot` saying why, where this device or its driver
  // cannot (no dma-buf support, memory a NIC cannot reach); throws
  // Error(InvalidArgument) for memory not from allocate(). The emulated
  // device's is the allocation's memfd, which the fake fabric registers.
  virtual int exportDmabuf(const void* base, size_t bytes, uint64_t* offset,
                           std::string* whyNot) = 0;
  // The device that holds `pointer`, or -1 for host memory. Cached: cheap
  // for a pointer asked about before.
  virtual int deviceOf(const void* pointer) = 0;

  // ---- Streams and events.
  virtual StreamHandle createStream(int device) = 0;
  virtual void destroyStream(StreamHandle stream) = 0;
  // Blocks until everything enqueued on `stream` has run.
  virtual void synchronize(StreamHandle stream) = 0;
  // An event of `device`, recorded on that device's streams.
  virtual EventHandle createEvent(int device) = 0;
  virtual void destroyEvent(EventHandle event) = 0;
  // The event completes once everything enqueued on `stream` so far ran.
  virtual void record(EventHandle event, StreamHandle stream) = 0;
  // What is enqueued on `stream` from now on waits for `event`.
  virtual void streamWait(StreamHandle stream, EventHandle event) = 0;
  // Whether the event completed (an event never recorded has). Never blocks.
  virtual bool query(EventHandle event) = 0;
  // Whether `stream` is being captured into a graph (cudaStreamIsCapturing).
  virtual bool capturing(StreamHandle stream) = 0;

  // ---- Graphs (for tests and tools; a user's program captures with the
  // CUDA runtime itself). Between beginCapture() and endCapture(), what
  // is enqueued on `stream` is recorded instead of run; the graph, once
  // launched, runs it on a stream as if enqueued there, any number of
  // times. The emulated device records its own stream only (no events).
  virtual void beginCapture(StreamHandle stream) = 0;
  // The captured work, ready to launch. Throws Error(InvalidUsage) when the
  // stream was not capturing, or the capture broke (an unsupported call).
  virtual GraphHandle endCapture(StreamHandle stream) = 0;
  virtual void launchGraph(GraphHandle graph, StreamHandle stream) = 0;
  // Launches already enqueued still run to their end, as on a GPU.
  virtual void destroyGraph(GraphHandle graph) = 0;

  // ---- Stream-ordered operations: enqueued, they return at once.
  virtual void copy(StreamHandle stream, void* dst, const void* src, size_t bytes) = 0;
  virtual void reduce(StreamHandle stream, const ReduceArgs& args) = 0;
  // The operations in order, as one batch (cuStreamBatchMemOp). Every
  // write is ordered after the work enqueued before it, and visible to
  // every process that maps the flag before anything after it runs.
  virtual void flagOps(StreamHandle stream, const FlagOp* ops, size_t count) = 0;

  // ---- From the host, now (not stream-ordered).
  // Stores `value` into a flag in device memory, waking the streams that
  // wait on it: how a failed op releases the waits its stream is blocked
  // on.
  virtual void writeFlagNow(uint32_t* flag, uint32_t value) = 0;
  virtual uint32_t readFlagNow(const uint32_t* flag) = 0;
  // Copies between any two of host and device memory and waits (tests,
  // set-up).
  virtual void copyNow(void* dst, const void* src, size_t bytes) = 0;
};

// The process's device, chosen at the first call from BRAID_DEVICE:
// "auto" (default) is CUDA where it is built and a GPU is present, else
// none; "cuda" and "emulated" name one; "none" turns device memory off.
// Returns nullptr for none, and then every pointer is host memory.
Device* current();

// The device, or throws Error(InvalidUsage) saying why there is none (no
// GPU or driver, braid built without CUDA, BRAID_DEVICE=none), as the start
// of a message about `what` needed it.
Device& require(const char* what);

// Why current() is null ("" when it is not).
std::string unavailableReason();

// For tests and tools: make `name` ("emulated", "cuda", "none") the
// process's device before the first current(). Throws Error(InvalidUsage)
// once a different one was chosen.
void select(const std::string& name);

// The cyclic comparison of FlagOp waits, for implementations.
inline bool passes(uint32_t observed, uint32_t value, Compare compare) {
  return compare == Compare::Equal ? observed == value
                                   : static_cast<int32_t>(observed - value) >= 0;
}

}  // namespace braid::device
