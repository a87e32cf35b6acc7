// The CUDA device's cache of foreign memory (src/device/cuda/pointer_cache.h),
// which answers deviceOf() for pointers the driver was asked about once. It
// is free of CUDA, so these run on every machine, with or without a GPU:
//
// - a range holds its first and last byte and nothing outside it; a
//   pointer holds its own address only; a range holding an address wins
//   over a pointer remembered there; host memory (-1) is an answer, not a
//   miss;
// - a new range drops the ranges it overlaps (stale: their memory was
//   freed and the addresses given out again), and keeps those it only
//   touches;
// - a full kind (ranges or pointers) is emptied by the next insertion of
//   that kind and fills again, the other kind untouched; clear() forgets
//   both; the CUDA device's cache holds 4096 of each.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "device/cuda/pointer_cache.h"

namespace braid::device::cuda {
namespace {

// What the cache answers for `address`: the device, or nothing.
std::optional<int> lookup(const PointerCache& cache, uintptr_t address) {
  int device = -2;
  if (!cache.find(address, &device)) return std::nullopt;
  return device;
}

TEST(PointerCache, EmptyFindsNothing) {
  PointerCache cache;
  EXPECT_EQ(lookup(cache, 0x1000), std::nullopt);
  EXPECT_EQ(cache.ranges(), 0u);
  EXPECT_EQ(cache.pointers(), 0u);
}

TEST(PointerCache, RangeHoldsItsFirstAndLastByteAndNothingOutside) {
  PointerCache cache;
  cache.addRange(0x10000, 0x1000, 3);
  EXPECT_EQ(lookup(cache, 0x10000), 3);             // first byte
  EXPECT_EQ(lookup(cache, 0x10800), 3);             // inside
  EXPECT_EQ(lookup(cache, 0x10fff), 3);             // last byte
  EXPECT_EQ(lookup(cache, 0x11000), std::nullopt);  // one past the end
  EXPECT_EQ(lookup(cache, 0x0ffff), std::nullopt);  // one before the start
  EXPECT_EQ(lookup(cache, 0), std::nullopt);
  EXPECT_EQ(lookup(cache, UINTPTR_MAX), std::nullopt);
}

TEST(PointerCache, RangesSideBySideAnswerEachForItsOwnBytes) {
  PointerCache cache;
  cache.addRange(0x20000, 0x1000, 0);
  cache.addRange(0x21000, 0x1000, 1);  // touches the first: both stay
  cache.addRange(0x30000, 0x10, 2);    // with a gap before it
  EXPECT_EQ(cache.ranges(), 3u);
  EXPECT_EQ(lookup(cache, 0x20fff), 0);
  EXPECT_EQ(lookup(cache, 0x21000), 1);
  EXPECT_EQ(lookup(cache, 0x21fff), 1);
  EXPECT_EQ(lookup(cache, 0x22000), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x2ffff), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x3000f), 2);
  EXPECT_EQ(lookup(cache, 0x30010), std::nullopt);
}

TEST(PointerCache, PointerHoldsItsOwnAddressOnly) {
  PointerCache cache;
  cache.addPointer(0x5000, 1);
  EXPECT_EQ(lookup(cache, 0x5000), 1);
  EXPECT_EQ(lookup(cache, 0x5001), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x4fff), std::nullopt);
}

TEST(PointerCache, HostMemoryIsAnAnswerNotAMiss) {
  PointerCache cache;
  cache.addPointer(0x7000, -1);
  cache.addRange(0x8000, 0x100, -1);
  EXPECT_EQ(lookup(cache, 0x7000), -1);
  EXPECT_EQ(lookup(cache, 0x80ff), -1);
}

TEST(PointerCache, RangeHoldingAnAddressWinsOverAPointerThere) {
  PointerCache cache;
  cache.addPointer(0x9010, -1);
  cache.addRange(0x9000, 0x100, 4);
  EXPECT_EQ(lookup(cache, 0x9010), 4);
  EXPECT_EQ(cache.pointers(), 1u);  // still held, only answered by the range
}

TEST(PointerCache, PointerRememberedAgainTakesTheNewDevice) {
  PointerCache cache;
  cache.addPointer(0xa000, 0);
  cache.addPointer(0xa000, 1);
  EXPECT_EQ(lookup(cache, 0xa000), 1);
  EXPECT_EQ(cache.pointers(), 1u);
}

TEST(PointerCache, NewRangeDropsTheStaleRangesItOverlaps) {
  PointerCache cache;
  cache.addRange(0x10000, 0x1000, 0);  // overlapped at its end
  cache.addRange(0x11800, 0x100, 1);   // inside the new range
  cache.addRange(0x12f00, 0x1000, 2);  // overlapped at its start
  cache.addRange(0x14000, 0x1000, 3);  // past the new range's end: stays
  cache.addRange(0x10800, 0x2800, 5);  // [0x10800, 0x13000)
  EXPECT_EQ(cache.ranges(), 2u);
  EXPECT_EQ(lookup(cache, 0x10000), std::nullopt);  // the dropped range's own bytes
  EXPECT_EQ(lookup(cache, 0x10800), 5);
  EXPECT_EQ(lookup(cache, 0x11800), 5);
  EXPECT_EQ(lookup(cache, 0x12fff), 5);
  EXPECT_EQ(lookup(cache, 0x13000), std::nullopt);  // the dropped range's own bytes
  EXPECT_EQ(lookup(cache, 0x14000), 3);
}

TEST(PointerCache, NewRangeAtTheSameStartReplacesTheOld) {
  PointerCache cache;
  cache.addRange(0x40000, 0x4000, 0);
  cache.addRange(0x40000, 0x1000, 1);
  EXPECT_EQ(cache.ranges(), 1u);
  EXPECT_EQ(lookup(cache, 0x40fff), 1);
  EXPECT_EQ(lookup(cache, 0x41000), std::nullopt);
}

TEST(PointerCache, NewRangeInsideAnOldOneDropsIt) {
  PointerCache cache;
  cache.addRange(0x50000, 0x10000, 0);
  cache.addRange(0x54000, 0x1000, 1);
  EXPECT_EQ(cache.ranges(), 1u);
  EXPECT_EQ(lookup(cache, 0x50000), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x54000), 1);
}

TEST(PointerCache, FullRangesAreEmptiedByTheNextAndFillAgain) {
  PointerCache cache(4);
  for (uintptr_t i = 0; i < 4; ++i) cache.addRange(0x100000 + i * 0x1000, 0x1000, 0);
  cache.addPointer(0x900000, 1);
  EXPECT_EQ(cache.ranges(), 4u);
  for (uintptr_t i = 0; i < 4; ++i) EXPECT_EQ(lookup(cache, 0x100000 + i * 0x1000), 0);

  cache.addRange(0x200000, 0x1000, 2);
  EXPECT_EQ(cache.ranges(), 1u);
  for (uintptr_t i = 0; i < 4; ++i) EXPECT_EQ(lookup(cache, 0x100000 + i * 0x1000), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x200000), 2);
  EXPECT_EQ(lookup(cache, 0x900000), 1);  // pointers are a kind of their own

  for (uintptr_t i = 1; i < 4; ++i) cache.addRange(0x200000 + i * 0x1000, 0x1000, 2);
  EXPECT_EQ(cache.ranges(), 4u);
}

TEST(PointerCache, FullPointersAreEmptiedByTheNextAndFillAgain) {
  PointerCache cache(4);
  cache.addRange(0x900000, 0x1000, 1);
  for (uintptr_t i = 0; i < 4; ++i) cache.addPointer(0x1000 + i, -1);
  EXPECT_EQ(cache.pointers(), 4u);

  cache.addPointer(0x2000, 0);
  EXPECT_EQ(cache.pointers(), 1u);
  for (uintptr_t i = 0; i < 4; ++i) EXPECT_EQ(lookup(cache, 0x1000 + i), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x2000), 0);
  EXPECT_EQ(lookup(cache, 0x900000), 1);  // ranges are a kind of their own
  EXPECT_EQ(cache.ranges(), 1u);
}

TEST(PointerCache, ClearForgetsRangesAndPointers) {
  PointerCache cache;
  cache.addRange(0x10000, 0x1000, 0);
  cache.addPointer(0x5000, -1);
  cache.clear();
  EXPECT_EQ(cache.ranges(), 0u);
  EXPECT_EQ(cache.pointers(), 0u);
  EXPECT_EQ(lookup(cache, 0x10000), std::nullopt);
  EXPECT_EQ(lookup(cache, 0x5000), std::nullopt);
}

TEST(PointerCache, TheDeviceCacheHolds4096OfEachKind) {
  PointerCache cache;
  const size_t capacity = cache.capacity();
  EXPECT_EQ(capacity, 4096u);
  for (uintptr_t i = 0; i < capacity; ++i) {
    cache.addPointer(0x100000 + i * 8, 0);
    cache.addRange(0x10000000 + i * 0x1000, 0x1000, 1);
  }
  EXPECT_EQ(cache.pointers(), capacity);
  EXPECT_EQ(cache.ranges(), capacity);
  EXPECT_EQ(lookup(cache, 0x100000), 0);
  EXPECT_EQ(lookup(cache, 0x10000000 + (capacity - 1) * 0x1000), 1);

  cache.addPointer(0x1, 0);
  cache.addRange(0x1000, 0x10, 1);
  EXPECT_EQ(cache.pointers(), 1u);
  EXPECT_EQ(cache.ranges(), 1u);
}

}  // namespace
}  // namespace braid::device::cuda
