// Streaming stores: SSE2's 16-byte non-temporal store, which every x86-64
// CPU has; the write-combining buffers merge four of them into one line
// write, so wider vectors gain nothing on a bandwidth-bound copy.
#include "reduce/streaming.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define BRAID_STREAMING_STORES 1
#endif

namespace braid::reduce {
namespace {

// The block the kernel writes before it is streamed out: eight lines, so
// that the reads of the inputs and the streamed writes interleave finely.
// With 4 KiB blocks, a float32 sum streamed this way ran slower than the
// kernel's own ordinary stores (braid-memcpy-bw: 18 against 25 GB/s of
// traffic, one process); with 512 B, faster (29 against 22).
constexpr size_t kBlockBytes = 512;

#if BRAID_STREAMING_STORES
enum class Store { Streaming, Ordinary };

// Copies the whole 64-byte lines of `bytes` from src to dst, 16 bytes at a
// time, and the tail with memcpy; with streaming stores, dst must lie on a
// 16-byte boundary.
template <Store kStore>
void lines(std::byte* dst, const std::byte* src, size_t bytes) {
  const size_t body = bytes / 64 * 64;
  for (size_t at = 0; at < body; at += 64) {
    __m128i v[4];
    for (size_t i = 0; i < 4; ++i)
      v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 16 * i));
    for (size_t i = 0; i < 4; ++i) {
      auto* to = reinterpret_cast<__m128i*>(dst + at + 16 * i);
      if constexpr (kStore == Store::Streaming)
        _mm_stream_si128(to, v[i]);
      else
        _mm_storeu_si128(to, v[i]);
    }
  }
  std::memcpy(dst + body, src + body, bytes - body);
}
#endif

// Streams `bytes` from src to dst without the closing fence.
void stream(std::byte* dst, const std::byte* src, size_t bytes) {
#if BRAID_STREAMING_STORES
  // Ordinary stores up to the first 16-byte boundary of dst.
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  lines<Store::Streaming>(dst + head, src + head, bytes - head);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Copies with ordinary 16-byte stores, a line per turn: the loop copy()
// takes where memcpy is slow.
void loop(std::byte* dst, const std::byte* src, size_t bytes) {
#if BRAID_STREAMING_STORES
  lines<Store::Ordinary>(dst, src, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void fence() {
#if BRAID_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace

void copyStreaming(void* dst, const void* src, size_t bytes) {
  stream(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
  fence();
}

void copy(void* dst, const void* src, size_t bytes) {
  if (copiesSlowly(dst, src))
    loop(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
  else
    std::memcpy(dst, src, bytes);
}

void reduceStreaming(Kernel kernel, void* dst, const void* a, const void* b, size_t count,
                     size_t elemSize, void* also, Also how) {
  alignas(64) std::byte block[kBlockBytes];
  const size_t perBlock = kBlockBytes / elemSize;
  auto* out = static_cast<std::byte*>(dst);
  auto* second = static_cast<std::byte*>(also);
  const auto* left = static_cast<const std::byte*>(a);
  const auto* right = static_cast<const std::byte*>(b);
  const bool cached = second && how == Also::Cached;  // the kernel writes `also` itself
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(perBlock, count - done);
    const size_t at = done * elemSize;
    std::byte* into = cached ? second + at : block;
    kernel(into, left + at, right + at, n);
    stream(out + at, into, n * elemSize);
    if (second && !cached) stream(second + at, block, n * elemSize);
    done += n;
  }
  fence();
}

void reduceCopying(Kernel kernel, void* dst, const void* a, const void* b, size_t count,
                   DataType type, ReduceOp op, int divisor, void* also) {
  constexpr size_t kCopyBlockBytes = 4096;
  const size_t elemSize = dataTypeSize(type);
  const size_t perBlock = std::max<size_t>(1, kCopyBlockBytes / elemSize);
  auto* out = static_cast<std::byte*>(dst);
  auto* second = static_cast<std::byte*>(also);
  const auto* left = static_cast<const std::byte*>(a);
  const auto* right = static_cast<const std::byte*>(b);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(perBlock, count - done);
    const size_t at = done * elemSize;
    kernel(out + at, left + at, right + at, n);
    finalize(out + at, n, type, op, divisor);
    reduce::copy(second + at, out + at, n * elemSize);
    done += n;
  }
}

size_t lastLevelCacheBytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = ::sysconf(name);
    if (bytes > 0) return static_cast<size_t>(bytes);
  }
  return size_t{32} << 20;
}

}  // namespace braid::reduce
