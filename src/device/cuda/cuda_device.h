// The CUDA device (BRAID_DEVICE=cuda, or auto where a GPU is present): a
// Device over the CUDA runtime (linked statically into libbraid) and the
// driver entry points it hands out (cudaGetDriverEntryPointByVersion), so
// libbraid never links libcuda and loads on machines without a driver.
//
// - Memory is cuMemCreate'd with POSIX file-descriptor handles, mapped with
//   cuMemMap and readable and writable by its device and by every device of
//   this process that has peer access to it; exportFd() and import() pass
//   it to same-host processes as file descriptors.
// - Streams are non-blocking CUDA streams and events are timing-free CUDA
//   events; copy and reduce are braid's kernels (kernels.h), or
//   cudaMemcpyAsync where host memory is involved; flag writes and waits are
//   stream memory operations (cuStreamBatchMemOp).
// - The host-side operations (writeFlagNow, readFlagNow, copyNow) run on a
//   private stream per device, never on the legacy default stream, which a
//   user's stream blocked on a flag wait would block.
//
// This header includes no CUDA header: src/device/device.cc, compiled
// without the toolkit's include paths, calls create().
//
// The binding, one concern per file: driver.h (the driver's entry points,
// CUDA failures as errors), contexts.h (per-device attributes, peer access,
// primary contexts, private streams), memory_map.h (braid's mappings and
// pointer classification) over pointer_cache.h (the CUDA-free cache of
// foreign memory), vmm_memory.h (cuMem device memory, fd and dma-buf
// export, import), host_memory.h (page-locked staging memory), streams.h
// (streams, events, graphs, copies, reductions, flag operations), and
// kernels.h (braid's kernels); cuda_device.cc puts them behind Device.
//
// Threading: create() may be called from any thread; every method of the
// device it returns may be called from any thread, as Device says.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"

namespace braid::device::cuda {

// The CUDA device, or nullptr with a one-line reason in *whyNot (when
// whyNot is not null) when CUDA cannot be used in this process: no driver
// (libcuda.so.1 cannot be loaded), no GPU (cudaGetDeviceCount fails or
// finds none), or a driver that lacks one of the entry points braid uses.
// Never throws.
std::unique_ptr<Device> create(std::string* whyNot);

}  // namespace braid::device::cuda
