// The CUDA device's record of its mappings and its pointer classification
// (memory_map.h).
//
// Threading: mutex_ held for every look at mappings_ and foreign_, never
// across a runtime or driver call.
#include "device/cuda/memory_map.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "braid/error.h"
#include "core/errors.h"
#include "device/cuda/contexts.h"

namespace braid::device::cuda {

void MemoryMap::remember(CUdeviceptr base, const Mapping& mapping) {
  std::lock_guard<std::mutex> lock(mutex_);
  mappings_[static_cast<uintptr_t>(base)] = mapping;
  foreign_.clear();
}

Mapping MemoryMap::forget(void* base, bool imported, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mappings_.find(reinterpret_cast<uintptr_t>(base));
  if (it == mappings_.end() || it->second.imported != imported)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: cuda device: %s: %p is not the start of memory from %s", what, base,
                       imported ? "import()" : "allocate()"));
  const Mapping mapping = it->second;
  mappings_.erase(it);
  return mapping;
}

bool MemoryMap::find(const void* base, Mapping* mapping) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mappings_.find(reinterpret_cast<uintptr_t>(base));
  if (it == mappings_.end()) return false;
  *mapping = it->second;
  return true;
}

int MemoryMap::deviceOf(const void* pointer) {
  if (!pointer) return -1;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const Mapping* mapping = holding(mappings_, address)) return mapping->device;
    if (int device = -1; foreign_.find(address, &device)) return device;
  }
  const RelaxedCapture relaxed;  // asked from any thread, while a user's may capture
  cudaPointerAttributes attributes{};
  if (const cudaError_t rc = cudaPointerGetAttributes(&attributes, pointer); rc != cudaSuccess)
    fail(rc, format("cudaPointerGetAttributes(%p)", pointer));
  // Managed memory counts as memory of the device it was made for.
  const bool onDevice =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  const int device = onDevice ? attributes.device : -1;
  CUdeviceptr start = 0;
  size_t bytes = 0;
  const bool ranged = onDevice &&
                      driver_.pointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                                  address) == CUDA_SUCCESS &&
                      driver_.pointerGetAttribute(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                                  address) == CUDA_SUCCESS &&
                      bytes > 0 && address - start < bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  if (ranged) {
    foreign_.addRange(static_cast<uintptr_t>(start), bytes, device);
  } else {
    foreign_.addPointer(address, device);
  }
  return device;
}

bool MemoryMap::pageLocked(const void* pointer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const Mapping* mapping = holding(mappings_, reinterpret_cast<uintptr_t>(pointer)))
      return mapping->device < 0;
  }
  const RelaxedCapture relaxed;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

size_t roundUp(size_t bytes, size_t granularity, const std::string& what) {
  const size_t wanted = std::max<size_t>(bytes, 1);
  if (wanted > SIZE_MAX - (granularity - 1))
    throw Error(ErrorCode::InvalidArgument, "braid: cuda device: " + what + ": too large");
  return (wanted + granularity - 1) / granularity * granularity;
}

}  // namespace braid::device::cuda
