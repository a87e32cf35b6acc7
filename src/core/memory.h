// The registry of memory from braid::memAlloc(): what the shared-memory
// transport needs to let a peer map it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid::memory {

struct Region {
  std::byte* base = nullptr;
  size_t bytes = 0;
  int fd = -1;      // the memfd behind it: a peer duplicates it and maps it
  uint64_t id = 0;  // unique within this process; 0 for "no region"

  explicit operator bool() const { return id != 0; }
  bool contains(const void* pointer, size_t length) const {
    const auto* p = static_cast<const std::byte*>(pointer);
    return p >= base && length <= bytes && static_cast<size_t>(p - base) <= bytes - length;
  }
};

// The region that holds `pointer`, or an empty one. Costs one relaxed load
// when nothing is registered.
Region find(const void* pointer);

// How many regions this process has freed so far. A peer that maps this
// process's regions drops its mappings when it sees the count change.
uint64_t freeCount();

}  // namespace braid::memory
