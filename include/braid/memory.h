// Memory that the peers of a communicator read in place.
#pragma once

#include <cstddef>

namespace braid {

// Allocates `bytes` of page-aligned, zero-filled host memory that braid can
// share with the other ranks on this host. An operation whose buffers come
// from here lets its same-host peers read (and reduce from) them directly
// instead of receiving a copy through shared-memory slots: one copy fewer
// per byte moved. Any communicator can use the memory, and ordinary
// pointers still work everywhere (inside this memory or not, at any
// offset). The counterpart of ncclMemAlloc.
// Throws Error(InvalidArgument) naming `bytes` when it is 0, and
// Error(SystemError) when the system cannot provide the memory.
void* memAlloc(size_t bytes);

// Frees memory from memAlloc(); nullptr is ignored. No operation that uses
// the memory may still be running. Throws Error(InvalidArgument) naming
// `pointer` when it is not the start of memory from memAlloc().
void memFree(void* pointer);

}  // namespace braid
