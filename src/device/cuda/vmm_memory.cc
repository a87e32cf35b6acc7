// Device memory through cuMemCreate and cuMemMap, passed on as file
// descriptors and dma-bufs (vmm_memory.h).
//
// Threading: no state here; see vmm_memory.h.
#include "device/cuda/vmm_memory.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>

#include <cstring>
#include <vector>

#include "braid/error.h"
#include "core/errors.h"

namespace braid::device::cuda {

void* VmmMemory::allocate(int device, size_t bytes) {
  contexts_.checkDevice(device, "allocate");
  const std::string what = format("allocate(%zu bytes, device %d)", bytes, device);
  ContextScope scope(contexts_, device);
  cudaStream_t stream = contexts_.privateStream(device);  // first: nothing to undo if it throws
  if (!contexts_.properties(device).virtualMemory) return allocateWithRuntime(device, bytes, what);
  const CUmemAllocationProp prop = allocationProp(device);
  const size_t granularity = granularityOf(prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, what);
  const size_t size = roundUp(bytes, granularity, what);

  const Driver& driver = contexts_.driver();
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr base = 0;
  const char* call = "cuMemCreate";
  CUresult rc = driver.memCreate(&handle, size, &prop, 0);
  if (rc == CUDA_SUCCESS) {
    rc = map(handle, size, granularity, device, /*peers=*/true, &base, &call);
    if (rc != CUDA_SUCCESS) driver.memRelease(handle);
  }
  if (rc != CUDA_SUCCESS) fail(driver, rc, format("%s: %s(%zu bytes)", what.c_str(), call, size));

  void* pointer = pointerOf(base);
  cudaError_t zeroed = cudaMemsetAsync(pointer, 0, size, stream);
  if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(stream);
  if (zeroed != cudaSuccess) {
    unmap(base, size, &call);
    driver.memRelease(handle);
    fail(zeroed, format("%s: zero-filling it (cudaMemsetAsync, %zu bytes)", what.c_str(), size));
  }
  memory_.remember(base, Mapping{size, device, /*imported=*/false, handle});
  return pointer;
}

// Without virtual memory management (some virtual machines and vGPUs), the
// runtime's memory: kernels of this process use it as any other (peer
// access is enabled per pair by Contexts::reaches), but no other process
// can map it, so exportFd() refuses it and the FIFOs to other processes are
// staged through host memory (Properties::fdHandles is false).
void* VmmMemory::allocateWithRuntime(int device, size_t bytes, const std::string& what) {
  const size_t size = roundUp(bytes, 256, what);
  void* pointer = nullptr;
  if (const cudaError_t rc = cudaMalloc(&pointer, size); rc != cudaSuccess)
    fail(rc, what + ": cudaMalloc (the device has no virtual memory management)");
  cudaStream_t stream = contexts_.privateStream(device);
  cudaError_t zeroed = cudaMemsetAsync(pointer, 0, size, stream);
  if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(stream);
  if (zeroed != cudaSuccess) {
    static_cast<void>(cudaFree(pointer));
    fail(zeroed, format("%s: zero-filling it (cudaMemsetAsync, %zu bytes)", what.c_str(), size));
  }
  Mapping mapping{size, device, /*imported=*/false, 0};
  mapping.runtime = true;
  memory_.remember(addressOf(pointer), mapping);
  return pointer;
}

// The mapping is opened to `device` alone: the memory lies on the
// exporter's GPU, which this process's other devices may not reach.
void* VmmMemory::import(int fd, size_t bytes, int device) {
  contexts_.checkDevice(device, "import");
  const std::string what = format("import(fd %d, %zu bytes, device %d)", fd, bytes, device);
  ContextScope scope(contexts_, device);
  // The exporter rounded its size up to a multiple of its (recommended,
  // larger) granularity; rounding to the minimum maps no byte beyond it.
  const CUmemAllocationProp prop = allocationProp(device);
  const size_t granularity = granularityOf(prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM, what);
  const size_t size = roundUp(bytes, granularity, what);

  const Driver& driver = contexts_.driver();
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr base = 0;
  const char* call = "cuMemImportFromShareableHandle";
  // The driver takes the fd itself in the pointer's place.
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  void* const osHandle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  CUresult rc = driver.memImportFromShareableHandle(&handle, osHandle,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc == CUDA_SUCCESS) {
    rc = map(handle, size, granularity, device, /*peers=*/false, &base, &call);
    // The mapping holds the memory from here on; the handle is not needed.
    driver.memRelease(handle);
  }
  if (rc != CUDA_SUCCESS) fail(driver, rc, format("%s: %s(%zu bytes)", what.c_str(), call, size));
  memory_.remember(base, Mapping{size, device, /*imported=*/true, 0});
  return pointerOf(base);
}

void VmmMemory::free(void* base, const Mapping& mapping) {
  ContextScope scope(contexts_, mapping.device);
  if (mapping.runtime) {
    if (const cudaError_t rc = cudaFree(base); rc != cudaSuccess)
      fail(rc,
           format("free(%p, %zu bytes, device %d): cudaFree", base, mapping.bytes, mapping.device));
    return;
  }
  const Driver& driver = contexts_.driver();
  const char* call = nullptr;
  CUresult rc = unmap(addressOf(base), mapping.bytes, &call);
  const CUresult released = driver.memRelease(mapping.handle);
  if (rc == CUDA_SUCCESS && released != CUDA_SUCCESS) {
    rc = released;
    call = "cuMemRelease";
  }
  if (rc != CUDA_SUCCESS)
    fail(driver, rc,
         format("free(%p, %zu bytes, device %d): %s", base, mapping.bytes, mapping.device, call));
}

void VmmMemory::unimport(void* base, const Mapping& mapping) {
  ContextScope scope(contexts_, mapping.device);
  const char* call = nullptr;
  if (const CUresult rc = unmap(addressOf(base), mapping.bytes, &call); rc != CUDA_SUCCESS)
    fail(contexts_.driver(), rc,
         format("unimport(%p, %zu bytes, device %d): %s", base, mapping.bytes, mapping.device,
                call));
}

int VmmMemory::exportFd(const void* base, const Mapping& mapping) {
  const Properties& device = contexts_.properties(mapping.device);
  if (mapping.runtime || !device.fdHandles)
    throw Error(ErrorCode::SystemError,
                format("braid: cuda device: exportFd(%p, device %d): the device has no %s, so "
                       "no other process can map its memory",
                       base, mapping.device,
                       device.virtualMemory ? "POSIX-fd handles for cuMem memory"
                                            : "virtual memory management"));
  int fd = -1;
  const Driver& driver = contexts_.driver();
  const CUresult rc = driver.memExportToShareableHandle(
      &fd, mapping.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (rc != CUDA_SUCCESS)
    fail(driver, rc,
         format("exportFd(%p, %zu bytes, device %d): cuMemExportToShareableHandle", base,
                mapping.bytes, mapping.device));
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // like braid's other fds: not inherited by children
  return fd;
}

// GPUDirect RDMA: the dma-buf of the whole allocation (its mapped length is
// a multiple of the granularity, so page-aligned).
int VmmMemory::exportDmabuf(const void* base, size_t bytes, uint64_t* offset, std::string* whyNot) {
  Mapping mapping;
  if (!memory_.find(base, &mapping) || mapping.imported || mapping.device < 0)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: cuda device: exportDmabuf: %p is not the start of device "
                       "memory from allocate()",
                       base));
  if (bytes > mapping.bytes)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: cuda device: exportDmabuf: %zu bytes at %p, and the allocation "
                       "has %zu",
                       bytes, base, mapping.bytes));
  if (mapping.runtime) {
    *whyNot = format(
        "device %d has no virtual memory management, and braid exports dma-bufs "
        "of cuMem memory only",
        mapping.device);
    return -1;
  }
  const bool dmabuf = contexts_.dmabuf(mapping.device);
  if (!dmabuf || !contexts_.rdmaWithVmm(mapping.device)) {
    *whyNot = format("device %d %s", mapping.device,
                     !dmabuf ? "or its driver does not export dma-bufs"
                             : "cannot give NICs its cuMem memory (no GPUDirect RDMA "
                               "with VMM)");
    return -1;
  }
  const Driver& driver = contexts_.driver();
  int fd = -1;
  const CUresult rc =
      driver.memGetHandleForAddressRange(&fd, reinterpret_cast<CUdeviceptr>(base), mapping.bytes,
                                         CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (rc != CUDA_SUCCESS) {
    *whyNot = format("cuMemGetHandleForAddressRange(%zu bytes, device %d): %s", mapping.bytes,
                     mapping.device, errorName(driver, rc).c_str());
    return -1;
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  *offset = 0;
  return fd;
}

CUmemAllocationProp VmmMemory::allocationProp(int device) const {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = contexts_.properties(device).fdHandles
                                  ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                  : CU_MEM_HANDLE_TYPE_NONE;
  prop.allocFlags.gpuDirectRDMACapable = contexts_.rdmaWithVmm(device) ? 1 : 0;
  return prop;
}

size_t VmmMemory::granularityOf(const CUmemAllocationProp& prop,
                                CUmemAllocationGranularity_flags which,
                                const std::string& what) const {
  size_t granularity = 0;
  if (const CUresult rc =
          contexts_.driver().memGetAllocationGranularity(&granularity, &prop, which);
      rc != CUDA_SUCCESS)
    fail(contexts_.driver(), rc, what + ": cuMemGetAllocationGranularity");
  return granularity;
}

// Reserves `size` bytes of address space, maps `handle` there and opens it
// for reading and writing to `device` and, with `peers`, to every device of
// this process that has peer access to `device`. On failure it undoes its
// own steps and returns the failed call's result, naming the call in *call.
CUresult VmmMemory::map(CUmemGenericAllocationHandle handle, size_t size, size_t alignment,
                        int device, bool peers, CUdeviceptr* base, const char** call) {
  const Driver& driver = contexts_.driver();
  *call = "cuMemAddressReserve";
  CUresult rc = driver.memAddressReserve(base, size, alignment, 0, 0);
  if (rc != CUDA_SUCCESS) return rc;
  *call = "cuMemMap";
  rc = driver.memMap(*base, size, 0, handle, 0);
  if (rc == CUDA_SUCCESS) {
    std::vector<CUmemAccessDesc> access;
    for (int d = 0; d < contexts_.count(); ++d) {
      if (d != device && !(peers && contexts_.canAccessPeer(d, device))) continue;
      CUmemAccessDesc desc;
      std::memset(&desc, 0, sizeof desc);
      desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      desc.location.id = d;
      desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access.push_back(desc);
    }
    *call = "cuMemSetAccess";
    rc = driver.memSetAccess(*base, size, access.data(), access.size());
    if (rc != CUDA_SUCCESS) driver.memUnmap(*base, size);
  }
  if (rc != CUDA_SUCCESS) {
    driver.memAddressFree(*base, size);
    *base = 0;
  }
  return rc;
}

// Unmaps and frees the address range; the first failure's result, with the
// call named in *call.
CUresult VmmMemory::unmap(CUdeviceptr base, size_t size, const char** call) {
  const Driver& driver = contexts_.driver();
  *call = "cuMemUnmap";
  CUresult rc = driver.memUnmap(base, size);
  const CUresult freed = driver.memAddressFree(base, size);
  if (rc == CUDA_SUCCESS && freed != CUDA_SUCCESS) {
    rc = freed;
    *call = "cuMemAddressFree";
  }
  return rc;
}

}  // namespace braid::device::cuda
