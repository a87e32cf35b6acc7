// The CUDA device's page-locked host memory, where FIFOs between GPUs
// without peer access are staged: a memfd mapped shared and registered with
// CUDA (portable: every context; mapped: kernels and stream memory
// operations use it through unified addressing). Same-host processes get
// the memfd itself (exportFd) and map it with import(). Every mapping is
// recorded in the MemoryMap, as host memory (device -1).
//
// Threading: every method may be called from any thread. This holds no
// state of its own: the record is the MemoryMap's (locked there).
#pragma once

#include <cstddef>

#include "device/cuda/contexts.h"
#include "device/cuda/memory_map.h"

namespace braid::device::cuda {

class HostMemory {
 public:
  // Both must outlive this.
  HostMemory(Contexts& contexts, MemoryMap& memory) : contexts_(contexts), memory_(memory) {}

  // Device::allocateHost: `bytes` of zero-filled page-locked memory.
  void* allocate(size_t bytes);
  // Device::importHost: maps another process's allocate() memory (its
  // exported fd, which stays the caller's).
  void* import(int fd, size_t bytes);
  // Unregisters, unmaps and closes memory from allocate(), whose record the
  // caller took out of the MemoryMap (`mapping`).
  void free(void* base, const Mapping& mapping);
  // Unregisters and unmaps memory from import(), whose record the caller
  // took out of the MemoryMap.
  void unimport(void* base, const Mapping& mapping);
  // A new file descriptor (a duplicate of the memfd) for the memory from
  // allocate() at `base`, whose record is `mapping`.
  int exportFd(const void* base, const Mapping& mapping);

 private:
  // Maps `size` bytes of the memfd `fd` and registers them; nullptr when
  // mmap fails. Throws when registering does.
  void* mapHost(int fd, size_t size, const char* what);
  void unmapHost(void* base, size_t size);

  Contexts& contexts_;
  MemoryMap& memory_;
};

}  // namespace braid::device::cuda
