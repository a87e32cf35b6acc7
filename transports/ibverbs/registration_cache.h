// A cache of memory registrations, so a buffer sent from again and again
// (a user's tensor, a staging buffer) is registered once. Registering and
// deregistering are injected (in the transport: VerbsBackend's
// registerMemory and deregister with the connection's PD and access bits;
// in tests: counters), so the cache is pure bookkeeping. Internal to
// transports/ibverbs.
//
// The cache registers whole pages (kPageBytes) and keeps the regions it
// holds disjoint: a range that overlaps regions without fitting in one is
// registered as the union of them all, and the regions it overlapped are
// retired (deregistered now if nobody holds them, else at their last
// release). So a lookup is one std::map search, and acquire() on a hit and
// release() allocate nothing.
//
// Not thread-safe: one thread (the transport's executor) uses a cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <utility>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs {

class RegistrationCache {
 public:
  static constexpr size_t kPageBytes = 4096;

  struct Registered {
    MemoryRegion* region = nullptr;
    Keys keys;
  };
  // Registers [base, base + bytes) (page-aligned); throws when it cannot,
  // and then has registered nothing.
  using Register = std::function<Registered(void* base, size_t bytes)>;
  // What it throws reaches the caller of release(), invalidate() or
  // acquire() with the region already out of the cache; the destructor
  // swallows it.
  using Deregister = std::function<void(MemoryRegion* region)>;

 private:
  struct Region;
  using Regions = std::list<Region>;
  struct Region {
    uintptr_t base = 0;
    size_t bytes = 0;
    Registered registered;
    int references = 0;
    bool retired = false;    // out of the lookup map: deregistered at its last release
    Regions::iterator self;  // in held_ while referenced, else in idle_
  };

 public:
  // A reference to a registered region covering the range acquired. Valid
  // until passed to release(); must not outlive the cache.
  class Handle {
   public:
    Handle() = default;
    explicit operator bool() const { return region_ != nullptr; }
    Keys keys() const { return region_->registered.keys; }
    MemoryRegion* region() const { return region_->registered.region; }
    // The registered region, which may be larger than the range acquired.
    uintptr_t base() const { return region_->base; }
    size_t bytes() const { return region_->bytes; }

   private:
    friend class RegistrationCache;
    explicit Handle(Region* region) : region_(region) {}
    Region* region_ = nullptr;
  };

  struct Counters {
    uint64_t hits = 0;         // acquire() found a region that covers the range
    uint64_t misses = 0;       // acquire() registered
    uint64_t evictions = 0;    // idle regions deregistered to stay within the capacity
    uint64_t invalidated = 0;  // regions invalidate() took out of the cache
    uint64_t merged = 0;       // regions retired because a larger one took their place
  };

  // `idleCapacityBytes`: how many bytes of registrations nobody holds are
  // kept for later hits; past it, the least recently released go first.
  // 0 deregisters each region at its last release.
  RegistrationCache(Register registerFn, Deregister deregisterFn, size_t idleCapacityBytes);
  // Deregisters every region, held or not.
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A region whose keys cover [address, address + bytes) (bytes 0 is taken
  // as 1, so an empty buffer still gets keys). Throws what the register
  // function throws, leaving the cache as it was; Error(InvalidArgument)
  // where the range wraps around the address space.
  Handle acquire(const void* address, size_t bytes);
  // Drops the reference `handle` holds; the handle is spent.
  void release(Handle& handle);
  // The memory [address, address + bytes) is about to be freed: regions
  // overlapping it are never hit again; those nobody holds are deregistered
  // now, the others at their last release.
  void invalidate(const void* address, size_t bytes);

  const Counters& counters() const { return counters_; }
  size_t regions() const { return held_.size() + idle_.size(); }  // retired ones included
  size_t idleBytes() const { return idleBytes_; }

 private:
  using ByBase = std::map<uintptr_t, Regions::iterator>;
  // The live regions overlapping [low, high): a run of byBase_.
  std::pair<ByBase::iterator, ByBase::iterator> overlapping(uintptr_t low, uintptr_t high);
  // Marks a region just taken out of byBase_: one still held is
  // deregistered at its last release, an idle one moves to `doomed`.
  void retire(Regions::iterator region, uint64_t* counter, Regions* doomed);
  // Deregisters every region of `doomed`, all of them even if some
  // deregistration throws (the first exception is rethrown at the end).
  void dropAll(Regions& doomed);
  void evictOverCapacity();
  // Erases the region from `list`, then deregisters it.
  void drop(Regions& list, Regions::iterator region);

  Register register_;
  Deregister deregister_;
  size_t idleCapacity_;
  // Regions held by someone, and the idle ones, least recently released
  // first; std::list so splicing between them moves no Region and
  // allocates nothing.
  Regions held_;
  Regions idle_;
  size_t idleBytes_ = 0;
  // The live (not retired) regions by base; disjoint.
  ByBase byBase_;
  Counters counters_;
};

}  // namespace braid::transport::ibverbs
