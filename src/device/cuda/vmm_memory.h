// The CUDA device's device memory, made with the driver's virtual memory
// management: cuMemCreate'd with POSIX file-descriptor handles, mapped with
// cuMemMap, opened (cuMemSetAccess) for reading and writing to its device
// and every device of this process with peer access to it, and zero-filled.
// Same-host processes get it as a file descriptor
// (cuMemExportToShareableHandle) and map it with import(); a NIC gets it as
// a dma-buf (cuMemGetHandleForAddressRange) for GPUDirect RDMA. Every
// mapping is recorded in the MemoryMap. A device without virtual memory
// management gets cudaMalloc'd memory instead, and one without POSIX-fd
// handles cuMem memory without them: neither is exported (Properties).
//
// Threading: every method may be called from any thread. This holds no
// state of its own: the record is the MemoryMap's (locked there), the
// per-device state the Contexts'.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "device/cuda/contexts.h"
#include "device/cuda/memory_map.h"

namespace braid::device::cuda {

class VmmMemory {
 public:
  // Both must outlive this.
  VmmMemory(Contexts& contexts, MemoryMap& memory) : contexts_(contexts), memory_(memory) {}

  // Device::allocate: `bytes` of zero-filled memory on `device`.
  void* allocate(int device, size_t bytes);
  // Device::import: maps another process's allocation (its exported fd),
  // opened to `device` alone.
  void* import(int fd, size_t bytes, int device);
  // Unmaps and releases memory from allocate(), whose record the caller
  // took out of the MemoryMap (`mapping`).
  void free(void* base, const Mapping& mapping);
  // Unmaps memory from import(), whose record the caller took out of the
  // MemoryMap.
  void unimport(void* base, const Mapping& mapping);
  // A new file descriptor for the allocation at `base` (its record:
  // `mapping`, memory from allocate()).
  int exportFd(const void* base, const Mapping& mapping);
  // Device::exportDmabuf.
  int exportDmabuf(const void* base, size_t bytes, uint64_t* offset, std::string* whyNot);

 private:
  void* allocateWithRuntime(int device, size_t bytes, const std::string& what);
  CUmemAllocationProp allocationProp(int device) const;
  size_t granularityOf(const CUmemAllocationProp& prop, CUmemAllocationGranularity_flags which,
                       const std::string& what) const;
  CUresult map(CUmemGenericAllocationHandle handle, size_t size, size_t alignment, int device,
               bool peers, CUdeviceptr* base, const char** call);
  CUresult unmap(CUdeviceptr base, size_t size, const char** call);

  Contexts& contexts_;
  MemoryMap& memory_;
};

}  // namespace braid::device::cuda
