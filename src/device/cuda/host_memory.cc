// Page-locked host memory for staging: a registered memfd (host_memory.h).
//
// Threading: no state here; see host_memory.h.
#include "device/cuda/host_memory.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "braid/error.h"
#include "core/errors.h"

namespace braid::device::cuda {

void* HostMemory::allocate(size_t bytes) {
  const size_t size = roundUp(bytes, static_cast<size_t>(::sysconf(_SC_PAGESIZE)),
                              format("allocateHost(%zu bytes)", bytes));
  const int fd = ::memfd_create("braid-staging", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error(ErrorCode::SystemError, format("braid: cuda device: allocateHost(%zu bytes): %s",
                                               bytes, std::strerror(err)));
  }
  void* base = mapHost(fd, size, "allocateHost");
  if (!base) {
    ::close(fd);
    throw Error(ErrorCode::SystemError,
                format("braid: cuda device: allocateHost(%zu bytes): mmap failed", bytes));
  }
  memory_.remember(addressOf(base), Mapping{size, -1, /*imported=*/false, 0, fd});
  return base;
}

void* HostMemory::import(int fd, size_t bytes) {
  const size_t size = roundUp(bytes, static_cast<size_t>(::sysconf(_SC_PAGESIZE)),
                              format("importHost(%zu bytes)", bytes));
  void* base = mapHost(fd, size, "importHost");
  if (!base)
    throw Error(ErrorCode::SystemError,
                format("braid: cuda device: importHost(fd %d, %zu bytes): mmap failed", fd, bytes));
  memory_.remember(addressOf(base), Mapping{size, -1, /*imported=*/true, 0, -1});
  return base;
}

void HostMemory::free(void* base, const Mapping& mapping) {
  unmapHost(base, mapping.bytes);
  ::close(mapping.hostFd);
}

void HostMemory::unimport(void* base, const Mapping& mapping) { unmapHost(base, mapping.bytes); }

int HostMemory::exportFd(const void* base, const Mapping& mapping) {
  const int copy = ::fcntl(mapping.hostFd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0)
    throw Error(ErrorCode::SystemError,
                format("braid: cuda device: exportFd(%p): dup: %s", base, std::strerror(errno)));
  return copy;
}

void* HostMemory::mapHost(int fd, size_t size, const char* what) {
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return nullptr;
  ContextScope scope(contexts_, contexts_.current());
  if (const cudaError_t rc =
          cudaHostRegister(base, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
      rc != cudaSuccess) {
    ::munmap(base, size);
    fail(rc, format("%s: cudaHostRegister(%zu bytes, portable, mapped)", what, size));
  }
  return base;
}

void HostMemory::unmapHost(void* base, size_t size) {
  ContextScope scope(contexts_, contexts_.current());
  const cudaError_t rc = cudaHostUnregister(base);
  ::munmap(base, size);
  if (rc != cudaSuccess) fail(rc, format("cudaHostUnregister(%p, %zu bytes)", base, size));
}

}  // namespace braid::device::cuda
