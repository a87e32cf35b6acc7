// What the CUDA device remembers of memory that is not its own, so that
// deviceOf() asks the runtime about a pointer once: allocation ranges on a
// device (the whole range the driver reports for a device pointer), and
// single pointers (host memory, for which no range is known). Free of
// CUDA: a map of addresses to devices, tested on machines without a GPU
// (tests/device_pointer_cache_test.cc).
//
// A full cache is emptied and fills again: each kind (ranges, pointers)
// holds at most `capacity` entries, and an insertion into a full one first
// drops all of that kind. An entry is never checked against the memory
// again: a foreign allocation that its owner frees and whose address comes
// back as memory of another kind or device is answered from the cache
// until it is dropped (as with NCCL's registration cache, a buffer must not
// change under a communicator that uses it).
//
// Threading: none of its own; the owner serializes every call (MemoryMap
// does so under its mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

namespace braid::device::cuda {

// The entry of `ranges` (keyed by start address, each with a `bytes`) that
// holds `address`, or nullptr.
template <typename T>
const T* holding(const std::map<uintptr_t, T>& ranges, uintptr_t address) {
  auto next = ranges.upper_bound(address);
  if (next == ranges.begin()) return nullptr;
  --next;
  return address - next->first < next->second.bytes ? &next->second : nullptr;
}

class PointerCache {
 public:
  // How many ranges, and how many pointers, the CUDA device's cache holds.
  static constexpr size_t kDefaultCapacity = 4096;

  // REQUIRES: capacity >= 1.
  explicit PointerCache(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  // Whether an entry holds `address`: a remembered range around it, else
  // the pointer itself remembered. When one does, *device is its device
  // (-1: host memory).
  bool find(uintptr_t address, int* device) const;

  // Remembers [start, start + bytes) as memory of `device`. The ranges it
  // overlaps are dropped first: they are stale, their memory freed and the
  // addresses given out again. REQUIRES: bytes >= 1, and start + bytes
  // does not wrap.
  void addRange(uintptr_t start, size_t bytes, int device);

  // Remembers `address` as memory of `device` (-1: host memory).
  void addPointer(uintptr_t address, int device);

  // Forgets everything: the address space changed under the cache.
  void clear();

  size_t ranges() const { return ranges_.size(); }
  size_t pointers() const { return pointers_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  // A foreign allocation's range, as the driver reported it.
  struct Range {
    size_t bytes = 0;
    int device = -1;
  };

  // Drops the ranges that overlap [start, start + bytes).
  void forgetRanges(uintptr_t start, size_t bytes);

  const size_t capacity_;
  std::map<uintptr_t, Range> ranges_;            // by range start; at most capacity_
  std::unordered_map<uintptr_t, int> pointers_;  // at most capacity_
};

}  // namespace braid::device::cuda
