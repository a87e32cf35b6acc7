#include "core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "braid/error.h"
#include "braid/memory.h"
#include "core/errors.h"

namespace braid {
namespace memory {
namespace {

// Regions by their base address. Freed regions are removed here before
// their memory is unmapped.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Region> regions;
  std::atomic<size_t> size{0};
  std::atomic<uint64_t> freed{0};
  uint64_t lastId = 0;
};

Registry& registry() {
  static Registry* instance = new Registry;  // never destroyed: ops may run at exit
  return *instance;
}

[[noreturn]] void failSystem(const std::string& what, int errnum) {
  throw Error(ErrorCode::SystemError,
              format("braid: memAlloc: %s: %s", what.c_str(), std::strerror(errnum)));
}

}  // namespace

Region find(const void* pointer) {
  Registry& r = registry();
  if (r.size.load(std::memory_order_relaxed) == 0) return {};
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(r.mutex);
  auto next = r.regions.upper_bound(address);
  if (next == r.regions.begin()) return {};
  const Region& region = std::prev(next)->second;
  return address - reinterpret_cast<uintptr_t>(region.base) < region.bytes ? region : Region{};
}

uint64_t freeCount() { return registry().freed.load(std::memory_order_acquire); }

}  // namespace memory

void* memAlloc(size_t bytes) {
  if (bytes == 0) throw Error(ErrorCode::InvalidArgument, "braid: memAlloc: bytes must not be 0");
  const long page = ::sysconf(_SC_PAGESIZE);
  const size_t length = (bytes + static_cast<size_t>(page) - 1) / static_cast<size_t>(page) *
                        static_cast<size_t>(page);
  if (length < bytes)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: memAlloc: bytes = %zu is too large", bytes));
  const int fd = ::memfd_create("braid-memory", MFD_CLOEXEC);
  if (fd < 0) memory::failSystem("memfd_create", errno);
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0) {
    const int err = errno;
    ::close(fd);
    memory::failSystem(format("ftruncate(%zu bytes)", length), err);
  }
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    memory::failSystem(format("mmap(%zu bytes)", length), err);
  }
  memory::Registry& r = memory::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  memory::Region region{static_cast<std::byte*>(base), length, fd, ++r.lastId};
  r.regions.emplace(reinterpret_cast<uintptr_t>(base), region);
  r.size.store(r.regions.size(), std::memory_order_relaxed);
  return base;
}

void memFree(void* pointer) {
  if (!pointer) return;
  memory::Registry& r = memory::registry();
  memory::Region region;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.regions.find(reinterpret_cast<uintptr_t>(pointer));
    if (it == r.regions.end())
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: memFree: pointer %p did not come from memAlloc", pointer));
    region = it->second;
    r.regions.erase(it);
    r.size.store(r.regions.size(), std::memory_order_relaxed);
    r.freed.fetch_add(1, std::memory_order_release);
  }
  ::munmap(region.base, region.bytes);
  ::close(region.fd);
}

}  // namespace braid
