#include "transports/ibverbs/registration_cache.h"

#include <algorithm>
#include <exception>
#include <iterator>
#include <limits>

#include "core/errors.h"

namespace braid::transport::ibverbs {

namespace {

constexpr uintptr_t kPageMask = RegistrationCache::kPageBytes - 1;
constexpr uintptr_t kMaxAddress = std::numeric_limits<uintptr_t>::max();

}  // namespace

RegistrationCache::RegistrationCache(Register registerFn, Deregister deregisterFn,
                                     size_t idleCapacityBytes)
    : register_(std::move(registerFn)),
      deregister_(std::move(deregisterFn)),
      idleCapacity_(idleCapacityBytes) {}

RegistrationCache::~RegistrationCache() {
  for (Regions* list : {&held_, &idle_})
    for (Region& region : *list) {
      try {
        deregister_(region.registered.region);
      } catch (...) {
        // Nothing to tell from a destructor; the device drops it at close.
      }
    }
}

std::pair<RegistrationCache::ByBase::iterator, RegistrationCache::ByBase::iterator>
RegistrationCache::overlapping(uintptr_t low, uintptr_t high) {
  ByBase::iterator first = byBase_.lower_bound(low);
  if (first != byBase_.begin()) {
    const ByBase::iterator before = std::prev(first);
    const Region& region = *before->second;
    if (region.base + region.bytes > low) first = before;
  }
  ByBase::iterator last = first;
  while (last != byBase_.end() && last->first < high) ++last;
  return {first, last};
}

RegistrationCache::Handle RegistrationCache::acquire(const void* address, size_t bytes) {
  if (bytes == 0) bytes = 1;
  const uintptr_t start = reinterpret_cast<uintptr_t>(address);
  if (bytes > kMaxAddress - start || start + bytes > kMaxAddress - kPageMask)
    throw Error(
        ErrorCode::InvalidArgument,
        format("registration of %zu bytes at %p wraps around the address space", bytes, address));
  const uintptr_t end = start + bytes;

  // A hit: the region with the greatest base at or below `start`, the only
  // one that can contain the range since regions are disjoint.
  ByBase::iterator at = byBase_.upper_bound(start);
  if (at != byBase_.begin()) {
    Region& region = *std::prev(at)->second;
    if (region.base + region.bytes >= end) {
      if (region.references == 0) {
        held_.splice(held_.end(), idle_, region.self);
        idleBytes_ -= region.bytes;
      }
      ++region.references;
      ++counters_.hits;
      return Handle(&region);
    }
  }

  // A miss: register the enclosing pages, widened to the regions the range
  // overlaps so that the live regions stay disjoint.
  uintptr_t low = start & ~kPageMask;
  uintptr_t high = (end + kPageMask) & ~kPageMask;
  const auto [first, last] = overlapping(low, high);
  if (first != last) {
    low = std::min(low, first->first);
    const Region& back = *std::prev(last)->second;
    high = std::max(high, back.base + back.bytes);
  }
  const Registered registered = register_(reinterpret_cast<void*>(low), high - low);

  // From here a failure deregisters the new region and leaves the cache
  // as it was, but for overlapped regions already retired.
  Regions fresh;
  try {
    fresh.emplace_back();
    if (first == last) byBase_.emplace(low, fresh.begin());
  } catch (...) {
    deregister_(registered.region);
    throw;
  }
  Region& region = fresh.front();
  region.base = low;
  region.bytes = high - low;
  region.registered = registered;
  region.references = 1;
  region.self = fresh.begin();
  if (first != last) {
    // The map node of the first region overlapped is reused for the new
    // one, so nothing past this point allocates.
    const ByBase::iterator rest = std::next(first);
    ByBase::node_type node = byBase_.extract(first);
    Regions doomed;
    retire(node.mapped(), &counters_.merged, &doomed);
    for (ByBase::iterator entry = rest; entry != last;) {
      retire(entry->second, &counters_.merged, &doomed);
      entry = byBase_.erase(entry);
    }
    try {
      dropAll(doomed);
    } catch (...) {
      deregister_(registered.region);
      throw;
    }
    node.key() = low;
    node.mapped() = region.self;
    byBase_.insert(std::move(node));
  }
  held_.splice(held_.end(), fresh);
  ++counters_.misses;
  return Handle(&region);
}

void RegistrationCache::release(Handle& handle) {
  Region* region = handle.region_;
  handle.region_ = nullptr;
  if (!region || region->references <= 0)
    throw Error(ErrorCode::Internal, "registration cache: release of a handle not held");
  if (--region->references > 0) return;
  if (region->retired) {
    drop(held_, region->self);
    return;
  }
  idle_.splice(idle_.end(), held_, region->self);
  idleBytes_ += region->bytes;
  evictOverCapacity();
}

void RegistrationCache::invalidate(const void* address, size_t bytes) {
  if (bytes == 0) bytes = 1;
  const uintptr_t start = reinterpret_cast<uintptr_t>(address);
  const uintptr_t end = bytes > kMaxAddress - start ? kMaxAddress : start + bytes;
  const auto [first, last] = overlapping(start, end);
  Regions doomed;
  for (ByBase::iterator entry = first; entry != last;) {
    retire(entry->second, &counters_.invalidated, &doomed);
    entry = byBase_.erase(entry);
  }
  dropAll(doomed);
}

void RegistrationCache::retire(Regions::iterator region, uint64_t* counter, Regions* doomed) {
  ++*counter;
  if (region->references > 0) {
    region->retired = true;
    return;
  }
  idleBytes_ -= region->bytes;
  doomed->splice(doomed->end(), idle_, region);
}

void RegistrationCache::dropAll(Regions& doomed) {
  std::exception_ptr first;
  while (!doomed.empty()) {
    try {
      drop(doomed, doomed.begin());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void RegistrationCache::evictOverCapacity() {
  while (idleBytes_ > idleCapacity_ && !idle_.empty()) {
    const Regions::iterator oldest = idle_.begin();
    byBase_.erase(oldest->base);
    idleBytes_ -= oldest->bytes;
    ++counters_.evictions;
    drop(idle_, oldest);
  }
}

void RegistrationCache::drop(Regions& list, Regions::iterator region) {
  MemoryRegion* registered = region->registered.region;
  list.erase(region);
  deregister_(registered);
}

}  // namespace braid::transport::ibverbs
