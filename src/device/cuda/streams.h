// The CUDA device's streams, events and graphs, and the work it enqueues on
// streams: copies and reductions (braid's kernels, kernels.h, or
// cudaMemcpyAsync where host memory is involved) and flag writes and waits
// (stream memory operations, cuStreamBatchMemOp, or a polling kernel for
// what those cannot express). Also the host-side operations that run now
// (writeFlagNow, readFlagNow, copyNow), on a device's private stream.
//
// Streams are non-blocking CUDA streams and events are timing-free CUDA
// events; the handles are the seam's opaque StreamHandle / EventHandle /
// GraphHandle.
//
// Threading: every method may be called from any thread. This holds no
// state of its own: deviceOf() is the MemoryMap's (locked there), the
// per-device state the Contexts'. CUDA's own calls are thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "device/cuda/contexts.h"
#include "device/cuda/memory_map.h"
#include "device/device.h"

namespace braid::device::cuda {

class Streams {
 public:
  // Both must outlive this.
  Streams(Contexts& contexts, MemoryMap& memory) : contexts_(contexts), memory_(memory) {}

  // ---- Streams, events and graphs: as Device's methods of the same names.
  StreamHandle createStream(int device);
  void destroyStream(StreamHandle stream);
  void synchronize(StreamHandle stream);
  EventHandle createEvent(int device);
  void destroyEvent(EventHandle event);
  void record(EventHandle event, StreamHandle stream);
  void streamWait(StreamHandle stream, EventHandle event);
  bool query(EventHandle event);
  bool capturing(StreamHandle stream);
  void beginCapture(StreamHandle stream);
  GraphHandle endCapture(StreamHandle stream);
  void launchGraph(GraphHandle graph, StreamHandle stream);
  void destroyGraph(GraphHandle graph);

  // ---- Stream-ordered operations: enqueued, they return at once.
  void copy(StreamHandle stream, void* dst, const void* src, size_t bytes);
  void reduce(StreamHandle stream, const ReduceArgs& args);
  void flagOps(StreamHandle stream, const FlagOp* ops, size_t count);

  // ---- From the host, now.
  void writeFlagNow(uint32_t* flag, uint32_t value);
  uint32_t readFlagNow(const uint32_t* flag);
  void copyNow(void* dst, const void* src, size_t bytes);

 private:
  static void checkReduce(const ReduceArgs& args);
  void checkReach(int device, const void* pointer);
  // Which side of a host-side copy is pageable host memory (the other is
  // device memory, or page-locked).
  enum class Pageable : uint8_t { None, Src, Dst };
  void transferNow(int device, void* dst, const void* src, size_t bytes, Pageable pageable,
                   const char* what);
  void finishPrivate(cudaStream_t stream, int device, const char* what);

  // How long finishPrivate() waits for a private stream.
  static constexpr auto kPrivateWait = std::chrono::seconds(10);

  Contexts& contexts_;
  MemoryMap& memory_;
};

}  // namespace braid::device::cuda
