// What the CUDA device knows of this process's address space: the memory
// it mapped itself (allocate, import, allocateHost, importHost), recorded
// by base address, and a PointerCache of everything else. deviceOf()
// classifies a pointer by them: braid's own mappings are known exactly;
// another pointer is asked about once (cudaPointerGetAttributes) and then
// remembered, device memory by the whole allocation range the driver
// reports, host memory per pointer.
//
// Threading: every method may be called from any thread. mutex_ guards the
// record of mappings and the cache; the runtime and driver queries run
// outside it.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "device/cuda/driver.h"
#include "device/cuda/pointer_cache.h"

namespace braid::device::cuda {

// One of braid's mappings: memory from allocate(), import(), allocateHost()
// or importHost().
struct Mapping {
  size_t bytes = 0;  // mapped length (rounded up to the granularity)
  int device = -1;   // -1: host memory (allocateHost, importHost)
  bool imported = false;
  CUmemGenericAllocationHandle handle = 0;  // allocate(): for exportFd and free; 0 for imports
  int hostFd = -1;                          // allocateHost(): the memfd behind it
  // allocate() on a device without virtual memory management: cudaMalloc'd,
  // freed by cudaFree, never exported.
  bool runtime = false;
};

class MemoryMap {
 public:
  // `driver` must outlive this.
  explicit MemoryMap(const Driver& driver) : driver_(driver) {}
  MemoryMap(const MemoryMap&) = delete;
  MemoryMap& operator=(const MemoryMap&) = delete;

  // Records a new mapping at `base`. A new mapping changes the address
  // space under the cache of foreign memory: it starts again.
  void remember(CUdeviceptr base, const Mapping& mapping);

  // Removes and returns the record of the mapping that starts at `base`.
  // Throws Error(InvalidArgument), naming `what`, when there is none or it
  // is not `imported` (import(), importHost()) as asked.
  Mapping forget(void* base, bool imported, const char* what);

  // The record of the mapping that starts at `base` in *mapping, and true;
  // false when no mapping starts there.
  bool find(const void* base, Mapping* mapping) const;

  // The device that holds `pointer`, or -1 for host memory (also for
  // nullptr). Throws Error(SystemError) when the runtime cannot say.
  int deviceOf(const void* pointer);

  // Whether `pointer`, host memory, is page-locked and so reachable by
  // kernels: braid's allocateHost() and importHost() memory, or memory the
  // program made (cudaHostAlloc) or registered (cudaHostRegister).
  bool pageLocked(const void* pointer);

 private:
  const Driver& driver_;
  mutable std::mutex mutex_;               // guards mappings_ and foreign_
  std::map<uintptr_t, Mapping> mappings_;  // by base address
  PointerCache foreign_;                   // memory not from this device's mappings
};

// `bytes` (0 counts as 1) rounded up to a multiple of `granularity`; throws
// Error(InvalidArgument) naming `what` when that does not fit in a size_t.
size_t roundUp(size_t bytes, size_t granularity, const std::string& what);

}  // namespace braid::device::cuda
