// The cache of foreign memory behind the CUDA device's deviceOf()
// (pointer_cache.h).
//
// Threading: none; the owner serializes calls.
#include "device/cuda/pointer_cache.h"

#include <iterator>

namespace braid::device::cuda {

bool PointerCache::find(uintptr_t address, int* device) const {
  if (const Range* range = holding(ranges_, address)) {
    *device = range->device;
    return true;
  }
  if (auto it = pointers_.find(address); it != pointers_.end()) {
    *device = it->second;
    return true;
  }
  return false;
}

void PointerCache::addRange(uintptr_t start, size_t bytes, int device) {
  if (ranges_.size() >= capacity_) ranges_.clear();
  forgetRanges(start, bytes);
  ranges_[start] = Range{bytes, device};
}

void PointerCache::addPointer(uintptr_t address, int device) {
  if (pointers_.size() >= capacity_) pointers_.clear();
  pointers_[address] = device;
}

void PointerCache::clear() {
  ranges_.clear();
  pointers_.clear();
}

void PointerCache::forgetRanges(uintptr_t start, size_t bytes) {
  auto it = ranges_.lower_bound(start);
  if (it != ranges_.begin()) {
    auto before = std::prev(it);
    if (before->first + before->second.bytes > start) it = before;
  }
  while (it != ranges_.end() && it->first < start + bytes) it = ranges_.erase(it);
}

}  // namespace braid::device::cuda
