// Writes that bypass the cache, for outputs too large to stay in it.
//
// An ordinary store must first own the cache line it writes, so writing n
// bytes that are not cached reads them too: 2n cross the memory bus. A
// streaming (non-temporal) store writes whole lines without reading them:
// n. Measured on this project's 2-vCPU EPYC VM, 128 MiB at a time: copies
// ran 10.5 GB/s with memcpy and 13.5 with streaming stores; an
// out-of-place float sum 7.3 and 10. For data that is read again soon the
// ordinary store is better: the line stays in the cache.
//
// Every function here ends with a store fence: its writes are visible to
// other threads and processes before anything the caller stores next (a
// flag that publishes them). Without x86-64 streaming stores they are
// ordinary copies.
#pragma once

#include <cstddef>

#include "reduce/reduce.h"

namespace braid::reduce {

// memcpy(dst, src, bytes) with streaming stores. The ranges must not overlap.
void copyStreaming(void* dst, const void* src, size_t bytes);

// kernel(dst, a, b, count) with streaming stores into dst, which must not
// overlap a or b: the kernel writes a block that stays in the L1 cache, and
// the block is streamed to dst, and to `also` where that is not null (a
// second copy, as neither). `elemSize`: the bytes of one element.
void reduceStreaming(Kernel kernel, void* dst, const void* a, const void* b, size_t count,
                     size_t elemSize, void* also = nullptr);

// The last-level cache of this CPU in bytes (sysconf), or 32 MiB where the
// system does not say.
size_t lastLevelCacheBytes();

}  // namespace braid::reduce
