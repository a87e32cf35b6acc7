// The GPUs of this process as the CUDA device uses them: what each can do
// (multiprocessors, GPUDirect RDMA with cuMem memory, dma-buf export),
// which reach which (peer access), and the state made on first use: the
// primary context, retained, and a private stream per device. ContextScope
// makes a device's primary context current for one call.
//
// Threading: every method may be called from any thread. What the
// constructor queries is fixed after it; the per-device state made on first
// use (primary context, private stream) and enabling peer access for a pair
// are std::call_once each. CUDA's own calls are thread-safe.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "device/cuda/driver.h"
#include "device/device.h"

namespace braid::device::cuda {

class Contexts {
 public:
  // Queries every device's attributes and which devices reach which.
  // Attribute and peer queries create no context: a process that uses one
  // GPU of eight costs the others nothing. Throws Error(SystemError) when a
  // query fails.
  Contexts(const Driver& driver, int count);
  // Destroys the private streams and releases the primary contexts this
  // made. Memory still allocated or imported stays mapped; the process's
  // end releases it. Errors are ignored: at exit the runtime may be gone.
  ~Contexts();
  Contexts(const Contexts&) = delete;
  Contexts& operator=(const Contexts&) = delete;

  const Driver& driver() const { return driver_; }
  int count() const { return count_; }
  // The driver's version (cudaDriverGetVersion).
  int driverVersion() const { return driverVersion_; }
  // Fixed at construction. REQUIRES: 0 <= device < count().
  const Properties& properties(int device) const { return devices_[device].properties; }
  int smCount(int device) const { return properties(device).multiprocessors; }
  // cuMemCreate can make NIC-registrable (dma-buf) memory on `device`.
  bool rdmaWithVmm(int device) const { return properties(device).rdmaWithVmm; }
  // cuMemGetHandleForAddressRange gives dma-buf fds of `device`'s memory.
  bool dmabuf(int device) const { return properties(device).dmabuf; }
  // Kernels of `device` read and write pageable host memory (HMM, ATS:
  // cudaDevAttrPageableMemoryAccess).
  bool readsPageableMemory(int device) const { return properties(device).pageableMemoryAccess; }

  // The calling thread's current device (cudaGetDevice).
  int current() const;
  // Throws Error(InvalidArgument) naming `what` unless `device` exists.
  void checkDevice(int device, const char* what) const;
  // Whether kernels on `device` can use memory of `peer`
  // (cudaDeviceCanAccessPeer, fixed); false for a device that does not
  // exist, true for a device and itself.
  bool canAccessPeer(int device, int peer) const;
  // Whether kernels of `device` can use memory of `other`; enables peer
  // access for the pair the first time (memory from cudaMalloc needs it;
  // braid's own is opened to its peers by cuMemSetAccess already).
  bool reaches(int device, int other);
  // The device of `stream` (that of its context: allowed in stream capture).
  int deviceOfStream(StreamHandle stream) const;
  // `device`'s primary context, retained on first use. A CUdevice is the
  // runtime's device ordinal.
  CUcontext primaryContext(int device);
  // `device`'s private stream, made on first use: non-blocking, of the
  // greatest priority (its work is a few bytes, which should not queue
  // behind bulk kernels). For zero-fills and the host-side operations
  // (writeFlagNow, readFlagNow, copyNow). REQUIRES: `device`'s context is
  // current.
  cudaStream_t privateStream(int device);
  // `device`'s bounce buffer: kBounceBytes of page-locked host memory, made
  // on first use, through which the host-side operations copy between
  // device memory and pageable host memory (a copy into pageable memory
  // returns only once done, so a deadline could not hold), and the mutex
  // that serializes its users. REQUIRES: `device`'s context is current.
  static constexpr size_t kBounceBytes = size_t{4} << 20;
  std::byte* bounce(int device);
  std::mutex& bounceMutex(int device) { return devices_[device].bounceMutex; }

 private:
  // Per device; the context and the stream are made on first use.
  struct PerDevice {
    Properties properties;
    std::once_flag contextOnce;
    CUcontext context = nullptr;  // the primary context, retained
    std::once_flag streamOnce;
    cudaStream_t stream = nullptr;  // private: writeFlagNow, readFlagNow, copyNow, zero-fill
    std::once_flag bounceOnce;
    std::byte* bounce = nullptr;  // cudaHostAlloc'd, kBounceBytes
    std::mutex bounceMutex;       // held while the bounce buffer is in use
  };
  // Reads `device`'s properties (the constructor).
  void query(int device);

  size_t pair(int device, int peer) const {
    return static_cast<size_t>(device) * static_cast<size_t>(count_) + static_cast<size_t>(peer);
  }

  const Driver driver_;
  const int count_;
  int driverVersion_ = 0;
  const std::unique_ptr<PerDevice[]> devices_;
  std::vector<bool> peerAccess_;  // [pair(device, peer)]: cudaDeviceCanAccessPeer, fixed
  const std::unique_ptr<std::once_flag[]> peerEnabled_;  // [pair(device, peer)]
};

// Makes `device`'s primary context current for the scope and then restores
// exactly what was current before, possibly no context at all. A method
// that works on a device (allocating there, launching on a stream of it)
// holds one, so the caller's current device never changes behind its back.
// Pushing the driver context, rather than cudaSetDevice() there and back,
// matters: setting back a device the thread never used would create its
// context (hundreds of MB of GPU memory) in every process. The runtime,
// braid's and the application's, works on whichever primary context is
// current.
// While in scope, the calling thread's CUDA calls are made in relaxed
// capture mode, then the thread's own mode is restored. A thread of
// braid's (the watchdog, a proxy) may call while a user's thread captures
// in cudaStreamCaptureModeGlobal (PyTorch's default), which forbids other
// threads calls such as cudaEventQuery and invalidates the user's graph:
// braid's calls are safe during a capture, so every one of them is made in
// relaxed mode, through this or a ContextScope.
class RelaxedCapture {
 public:
  RelaxedCapture() { static_cast<void>(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCapture() { static_cast<void>(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // the caller's, while in scope
};

class ContextScope {
 public:
  ContextScope(Contexts& contexts, int device);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  // Relaxed capture mode (first member: restored also when the
  // constructor throws).
  RelaxedCapture relaxed_;
  const Driver& driver_;
  bool pushed_ = false;
};

}  // namespace braid::device::cuda
