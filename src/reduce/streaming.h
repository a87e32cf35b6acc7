// The executor's copies: writes that bypass the cache, for outputs too
// large to stay in it, and an ordinary copy that steers clear of memcpy's
// slow case.
//
// An ordinary store must first own the cache line it writes, so writing n
// bytes that are not cached reads them too: 2n cross the memory bus. A
// streaming (non-temporal) store writes whole lines without reading them:
// n. Measured on this project's 2-vCPU EPYC VM, 128 MiB at a time: copies
// ran 10.5 GB/s with memcpy and 13.5 with streaming stores; an
// out-of-place float sum 7.3 and 10. For data that is read again soon the
// ordinary store is better: the line stays in the cache.
//
// Every streaming function here ends with a store fence: its writes are visible to
// other threads and processes before anything the caller stores next (a
// flag that publishes them). Without x86-64 streaming stores they are
// ordinary copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reduce/reduce.h"

namespace braid::reduce {

// memcpy(dst, src, bytes) with streaming stores. The ranges must not overlap.
void copyStreaming(void* dst, const void* src, size_t bytes);

// memcpy(dst, src, bytes) with ordinary stores, minding one case. Where dst
// lies a few bytes past src modulo 4 KiB, glibc's memcpy (`rep movsb` on
// this project's EPYC VM) ran 2 to 5 times slower copying 128 MiB in 256
// KiB pieces (at 1 to 31 bytes; a malloc'd output, 16 bytes into its page,
// filled from a slot on a page is one such case), and 14 times slower for
// 64 KiB pieces in the cache at 1 to 8 bytes: each load waits for a store
// that only seems to overlap it. From 1 to 63 bytes a plain vector loop
// copies instead, at memcpy's usual speed. The ranges must not overlap.
// (No fence: the caller's release store orders the bytes before a flag,
// as after memcpy.)
void copy(void* dst, const void* src, size_t bytes);

// Whether dst lies 1 to 63 bytes past src modulo 4 KiB: where memcpy, and
// the kernel's copy behind process_vm_readv, may be slow (see copy()).
inline bool copiesSlowly(const void* dst, const void* src) {
  constexpr uintptr_t kPage = 4096, kNear = 64;
  const uintptr_t past =
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) % kPage;
  return past != 0 && past < kNear;
}

// Where reduceStreaming puts a second copy of the result, if it is given
// one: written past the cache as dst is, or with ordinary stores (a slot
// that a peer reads next).
enum class Also { Streamed, Cached };

// kernel(dst, a, b, count) with streaming stores into dst, which must not
// overlap a or b, block by block (512 B), so that the reads of a and b and
// the writes to memory overlap: the kernel writes a block that stays in the
// L1 cache, and the block is streamed to dst. `also`, where not null, gets
// the result too, as `how` says (Cached: the kernel writes there, and dst
// is streamed from there). `elemSize`: the bytes of one element.
void reduceStreaming(Kernel kernel, void* dst, const void* a, const void* b, size_t count,
                     size_t elemSize, void* also = nullptr, Also how = Also::Streamed);

// kernel(dst, a, b, count) and then finalize(dst, count, type, op,
// divisor) (Avg divides), with the result copied to `also` as well, block by
// block (4 KiB) and with ordinary stores: each block is copied while it is
// still in the L1 cache, and the copy's writes overlap the kernel's reads.
// `also` must not overlap dst, a or b.
void reduceCopying(Kernel kernel, void* dst, const void* a, const void* b, size_t count,
                   DataType type, ReduceOp op, int divisor, void* also);

// The last-level cache of this CPU in bytes (sysconf), or 32 MiB where the
// system does not say.
size_t lastLevelCacheBytes();

}  // namespace braid::reduce
