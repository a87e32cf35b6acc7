#include "device/cuda/cuda_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "braid/error.h"
#include "core/errors.h"
#include "device/cuda/kernels.h"

namespace braid::device::cuda {
namespace {

// How many foreign ranges, and foreign pointers, deviceOf() remembers; a
// full cache is emptied and fills again.
constexpr size_t kMaxCached = 4096;

// Operations per cuStreamBatchMemOp call (the driver takes fewer than 256);
// a longer flagOps() batch is several calls in a row, in order.
constexpr size_t kBatchOps = 64;

// The driver functions braid calls, obtained from the runtime at the ABI of
// the headers they are declared in (CUDART_VERSION): libbraid never links
// libcuda, so it loads and runs host collectives where there is no driver.
// Filled once by resolve(), read-only after.
struct Driver {
  decltype(&::cuGetErrorName) getErrorName = nullptr;
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primaryCtxRelease = nullptr;
  decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
  decltype(&::cuCtxPushCurrent) ctxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) ctxPopCurrent = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) memCreate = nullptr;
  decltype(&::cuMemRelease) memRelease = nullptr;
  decltype(&::cuMemAddressReserve) memAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) memAddressFree = nullptr;
  decltype(&::cuMemMap) memMap = nullptr;
  decltype(&::cuMemUnmap) memUnmap = nullptr;
  decltype(&::cuMemSetAccess) memSetAccess = nullptr;
  decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle = nullptr;
  decltype(&::cuPointerGetAttribute) pointerGetAttribute = nullptr;
  decltype(&::cuStreamWriteValue32) streamWriteValue32 = nullptr;
  decltype(&::cuStreamBatchMemOp) streamBatchMemOp = nullptr;
  // Optional (GPUDirect RDMA through dma-buf): null where the driver lacks it.
  decltype(&::cuMemGetHandleForAddressRange) memGetHandleForAddressRange = nullptr;
};

// Fills `d`; returns the first entry point the driver does not have, or
// nullptr when it has them all.
const char* resolve(Driver& d) {
  const char* missing = nullptr;
  auto get = [&missing](const char* symbol, auto& slot) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &function, CUDART_VERSION,
                                                            cudaEnableDefault, &found);
    if (rc == cudaSuccess && found == cudaDriverEntryPointSuccess && function) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(function);
    } else {
      static_cast<void>(cudaGetLastError());
      if (!missing) missing = symbol;
    }
  };
  get("cuGetErrorName", d.getErrorName);
  get("cuGetErrorString", d.getErrorString);
  get("cuDeviceGetAttribute", d.deviceGetAttribute);
  get("cuDevicePrimaryCtxRetain", d.primaryCtxRetain);
  get("cuDevicePrimaryCtxRelease", d.primaryCtxRelease);
  get("cuCtxGetCurrent", d.ctxGetCurrent);
  get("cuCtxPushCurrent", d.ctxPushCurrent);
  get("cuCtxPopCurrent", d.ctxPopCurrent);
  get("cuMemGetAllocationGranularity", d.memGetAllocationGranularity);
  get("cuMemCreate", d.memCreate);
  get("cuMemRelease", d.memRelease);
  get("cuMemAddressReserve", d.memAddressReserve);
  get("cuMemAddressFree", d.memAddressFree);
  get("cuMemMap", d.memMap);
  get("cuMemUnmap", d.memUnmap);
  get("cuMemSetAccess", d.memSetAccess);
  get("cuMemExportToShareableHandle", d.memExportToShareableHandle);
  get("cuMemImportFromShareableHandle", d.memImportFromShareableHandle);
  get("cuPointerGetAttribute", d.pointerGetAttribute);
  get("cuStreamWriteValue32", d.streamWriteValue32);
  get("cuStreamBatchMemOp", d.streamBatchMemOp);
  const char* required = missing;
  get("cuMemGetHandleForAddressRange", d.memGetHandleForAddressRange);
  return required;
}

// Throws Error(SystemError) for a failed runtime call; `call` names it and
// the arguments that matter. The runtime also keeps the failure as the
// thread's last error, which braid's kernel launches return
// (cudaGetLastError in kernels.cu): it is consumed here, so that the next
// launch does not report it as its own. (Sticky errors stay: the context is
// lost then.)
[[noreturn]] void fail(cudaError_t rc, const std::string& call) {
  static_cast<void>(cudaGetLastError());
  throw Error(ErrorCode::SystemError, format("braid: cuda device: %s: %s (%s)", call.c_str(),
                                             cudaGetErrorString(rc), cudaGetErrorName(rc)));
}

// Throws Error(SystemError) for a failed driver call, as fail(cudaError_t).
[[noreturn]] void fail(const Driver& driver, CUresult rc, const std::string& call) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.getErrorName(rc, &name) != CUDA_SUCCESS) name = nullptr;
  if (driver.getErrorString(rc, &text) != CUDA_SUCCESS) text = nullptr;
  const std::string number = std::to_string(static_cast<int>(rc));
  throw Error(ErrorCode::SystemError,
              format("braid: cuda device: %s: %s (%s)", call.c_str(), text ? text : "unknown error",
                     name ? name : number.c_str()));
}

cudaStream_t streamOf(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t eventOf(EventHandle event) { return static_cast<cudaEvent_t>(event); }
CUdeviceptr addressOf(const void* pointer) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(pointer));
}
void* pointerOf(CUdeviceptr address) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a CUdeviceptr is an address
  return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
}

// The entry of `ranges` (keyed by base address, each with a `bytes`) that
// holds `address`, or nullptr.
template <typename T>
const T* holding(const std::map<uintptr_t, T>& ranges, uintptr_t address) {
  auto next = ranges.upper_bound(address);
  if (next == ranges.begin()) return nullptr;
  --next;
  return address - next->first < next->second.bytes ? &next->second : nullptr;
}

CUstreamBatchMemOpParams memOpOf(const FlagOp& op) {
  CUstreamBatchMemOpParams params;
  std::memset(&params, 0, sizeof params);
  if (op.kind == FlagOp::Kind::Write) {
    params.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    params.writeValue.address = addressOf(op.flag);
    params.writeValue.value = op.value;
    // Default: a system-scope fence first, so the work enqueued before the
    // write has landed, for every process, when the flag changes.
    params.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  } else {
    params.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    params.waitValue.address = addressOf(op.flag);
    params.waitValue.value = op.value;
    // GEQ is the cyclic (int32_t)(*flag - value) >= 0 of device::passes().
    params.waitValue.flags =
        op.compare == Compare::Equal ? CU_STREAM_WAIT_VALUE_EQ : CU_STREAM_WAIT_VALUE_GEQ;
  }
  return params;
}

// ---- The device.
//
// Threading: every method may be called from any thread. mutex_ guards the
// record of mappings and the deviceOf() caches; the per-device state made
// on first use (primary context, private stream) and peer-access enabling
// are std::call_once; everything else is fixed at construction. CUDA's own
// calls are thread-safe.
//
// Current device: a method that works on a device (allocating there,
// launching on a stream of it) makes that device's primary context current
// for the call with Scope and restores exactly what was current before, so
// the caller's current device never changes behind its back.
class CudaDevice final : public Device {
 public:
  CudaDevice(const Driver& driver, int count)
      : driver_(driver),
        count_(count),
        devices_(new PerDevice[static_cast<size_t>(count)]),
        peerAccess_(static_cast<size_t>(count) * static_cast<size_t>(count), false),
        peerEnabled_(new std::once_flag[static_cast<size_t>(count) * static_cast<size_t>(count)]) {
    // Attribute and peer queries create no context: a process that uses one
    // GPU of eight costs the others nothing.
    for (int d = 0; d < count_; ++d) {
      PerDevice& device = devices_[d];
      cudaError_t rc = cudaDeviceGetAttribute(&device.smCount, cudaDevAttrMultiProcessorCount, d);
      if (rc != cudaSuccess)
        fail(rc, format("cudaDeviceGetAttribute(multiprocessor count, device %d)", d));
      int rdma = 0;
      const CUresult crc = driver_.deviceGetAttribute(
          &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, d);
      if (crc != CUDA_SUCCESS)
        fail(driver_, crc, format("cuDeviceGetAttribute(GPUDirect RDMA with VMM, device %d)", d));
      device.rdmaWithVmm = rdma != 0;
      int dmabuf = 0;
      if (driver_.deviceGetAttribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d) !=
          CUDA_SUCCESS)
        dmabuf = 0;  // an older driver that does not know the attribute
      device.dmabuf = dmabuf != 0 && driver_.memGetHandleForAddressRange != nullptr;
      for (int peer = 0; peer < count_; ++peer) {
        int can = 1;
        if (peer != d) {
          rc = cudaDeviceCanAccessPeer(&can, d, peer);
          if (rc != cudaSuccess)
            fail(rc, format("cudaDeviceCanAccessPeer(device %d, peer %d)", d, peer));
        }
        peerAccess_[pair(d, peer)] = can != 0;
      }
    }
  }

  // Memory still allocated or imported stays mapped; the process's end
  // releases it. Errors are ignored: at exit the runtime may be gone.
  ~CudaDevice() override {
    for (int d = 0; d < count_; ++d) {
      if (devices_[d].stream) cudaStreamDestroy(devices_[d].stream);
      if (devices_[d].context) driver_.primaryCtxRelease(d);
    }
    static_cast<void>(cudaGetLastError());
  }

  const char* name() const override { return "cuda"; }
  int count() const override { return count_; }

  int current() const override {
    int device = 0;
    if (const cudaError_t rc = cudaGetDevice(&device); rc != cudaSuccess) fail(rc, "cudaGetDevice");
    return device;
  }

  void setCurrent(int device) override {
    checkDevice(device, "setCurrent");
    if (const cudaError_t rc = cudaSetDevice(device); rc != cudaSuccess)
      fail(rc, format("cudaSetDevice(%d)", device));
  }

  bool canAccessPeer(int device, int peer) const override {
    if (device < 0 || device >= count_ || peer < 0 || peer >= count_) return false;
    return peerAccess_[pair(device, peer)];
  }

  // ---- Memory.

  void* allocate(int device, size_t bytes) override {
    checkDevice(device, "allocate");
    const std::string what = format("allocate(%zu bytes, device %d)", bytes, device);
    Scope scope(*this, device);
    cudaStream_t stream = privateStream(device);  // first: nothing to undo if it throws
    const CUmemAllocationProp prop = allocationProp(device);
    const size_t granularity = granularityOf(prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, what);
    const size_t size = roundUp(bytes, granularity, what);

    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr base = 0;
    const char* call = "cuMemCreate";
    CUresult rc = driver_.memCreate(&handle, size, &prop, 0);
    if (rc == CUDA_SUCCESS) {
      rc = map(handle, size, granularity, device, /*peers=*/true, &base, &call);
      if (rc != CUDA_SUCCESS) driver_.memRelease(handle);
    }
    if (rc != CUDA_SUCCESS)
      fail(driver_, rc, format("%s: %s(%zu bytes)", what.c_str(), call, size));

    void* pointer = pointerOf(base);
    cudaError_t zeroed = cudaMemsetAsync(pointer, 0, size, stream);
    if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(stream);
    if (zeroed != cudaSuccess) {
      unmap(base, size, &call);
      driver_.memRelease(handle);
      fail(zeroed, format("%s: zero-filling it (cudaMemsetAsync, %zu bytes)", what.c_str(), size));
    }
    remember(base, Mapping{size, device, /*imported=*/false, handle});
    return pointer;
  }

  // ---- Host memory for staging: a memfd mapped shared, registered with
  // CUDA (portable: every context; mapped: kernels and stream memory
  // operations use it through unified addressing).

  void* allocateHost(size_t bytes) override {
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
    remember(addressOf(base), Mapping{size, -1, /*imported=*/false, 0, fd});
    return base;
  }

  void* importHost(int fd, size_t bytes) override {
    const size_t size = roundUp(bytes, static_cast<size_t>(::sysconf(_SC_PAGESIZE)),
                                format("importHost(%zu bytes)", bytes));
    void* base = mapHost(fd, size, "importHost");
    if (!base)
      throw Error(
          ErrorCode::SystemError,
          format("braid: cuda device: importHost(fd %d, %zu bytes): mmap failed", fd, bytes));
    remember(addressOf(base), Mapping{size, -1, /*imported=*/true, 0, -1});
    return base;
  }

  void free(void* base) override {
    const Mapping mapping = forget(base, /*imported=*/false, "free");
    if (mapping.device < 0) {
      unmapHost(base, mapping.bytes);
      ::close(mapping.hostFd);
      return;
    }
    Scope scope(*this, mapping.device);
    const char* call = nullptr;
    CUresult rc = unmap(addressOf(base), mapping.bytes, &call);
    const CUresult released = driver_.memRelease(mapping.handle);
    if (rc == CUDA_SUCCESS && released != CUDA_SUCCESS) {
      rc = released;
      call = "cuMemRelease";
    }
    if (rc != CUDA_SUCCESS)
      fail(driver_, rc,
           format("free(%p, %zu bytes, device %d): %s", base, mapping.bytes, mapping.device, call));
  }

  int exportFd(const void* base) override {
    Mapping mapping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = mappings_.find(reinterpret_cast<uintptr_t>(base));
      if (it == mappings_.end() || it->second.imported)
        throw Error(ErrorCode::InvalidArgument,
                    format("braid: cuda device: exportFd: %p is not the start of memory from "
                           "allocate()",
                           base));
      mapping = it->second;
    }
    if (mapping.device < 0) {  // staging memory: its memfd
      const int copy = ::fcntl(mapping.hostFd, F_DUPFD_CLOEXEC, 0);
      if (copy < 0)
        throw Error(ErrorCode::SystemError, format("braid: cuda device: exportFd(%p): dup: %s",
                                                   base, std::strerror(errno)));
      return copy;
    }
    int fd = -1;
    const CUresult rc = driver_.memExportToShareableHandle(
        &fd, mapping.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != CUDA_SUCCESS)
      fail(driver_, rc,
           format("exportFd(%p, %zu bytes, device %d): cuMemExportToShareableHandle", base,
                  mapping.bytes, mapping.device));
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // like braid's other fds: not inherited by children
    return fd;
  }

  // GPUDirect RDMA: the dma-buf of the whole allocation (its mapped
  // length is a multiple of the granularity, so page-aligned).
  int exportDmabuf(const void* base, size_t bytes, uint64_t* offset, std::string* whyNot) override {
    Mapping mapping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = mappings_.find(reinterpret_cast<uintptr_t>(base));
      if (it == mappings_.end() || it->second.imported || it->second.device < 0)
        throw Error(ErrorCode::InvalidArgument,
                    format("braid: cuda device: exportDmabuf: %p is not the start of device "
                           "memory from allocate()",
                           base));
      mapping = it->second;
    }
    if (bytes > mapping.bytes)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: cuda device: exportDmabuf: %zu bytes at %p, and the allocation "
                         "has %zu",
                         bytes, base, mapping.bytes));
    const PerDevice& device = devices_[mapping.device];
    if (!device.dmabuf || !device.rdmaWithVmm) {
      *whyNot = format("device %d %s", mapping.device,
                       !device.dmabuf ? "or its driver does not export dma-bufs"
                                      : "cannot give NICs its cuMem memory (no GPUDirect RDMA "
                                        "with VMM)");
      return -1;
    }
    int fd = -1;
    const CUresult rc =
        driver_.memGetHandleForAddressRange(&fd, reinterpret_cast<CUdeviceptr>(base), mapping.bytes,
                                            CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (rc != CUDA_SUCCESS) {
      const char* name = nullptr;
      if (driver_.getErrorName(rc, &name) != CUDA_SUCCESS) name = nullptr;
      *whyNot = format("cuMemGetHandleForAddressRange(%zu bytes, device %d): %s", mapping.bytes,
                       mapping.device, name ? name : std::to_string(static_cast<int>(rc)).c_str());
      return -1;
    }
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    *offset = 0;
    return fd;
  }

  // The mapping is opened to `device` alone: the memory lies on the
  // exporter's GPU, which this process's other devices may not reach.
  void* import(int fd, size_t bytes, int device) override {
    checkDevice(device, "import");
    const std::string what = format("import(fd %d, %zu bytes, device %d)", fd, bytes, device);
    Scope scope(*this, device);
    // The exporter rounded its size up to a multiple of its (recommended,
    // larger) granularity; rounding to the minimum maps no byte beyond it.
    const CUmemAllocationProp prop = allocationProp(device);
    const size_t granularity = granularityOf(prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM, what);
    const size_t size = roundUp(bytes, granularity, what);

    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr base = 0;
    const char* call = "cuMemImportFromShareableHandle";
    // The driver takes the fd itself in the pointer's place.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    void* const osHandle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
    CUresult rc = driver_.memImportFromShareableHandle(&handle, osHandle,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (rc == CUDA_SUCCESS) {
      rc = map(handle, size, granularity, device, /*peers=*/false, &base, &call);
      // The mapping holds the memory from here on; the handle is not needed.
      driver_.memRelease(handle);
    }
    if (rc != CUDA_SUCCESS)
      fail(driver_, rc, format("%s: %s(%zu bytes)", what.c_str(), call, size));
    remember(base, Mapping{size, device, /*imported=*/true, 0});
    return pointerOf(base);
  }

  void unimport(void* base, size_t bytes) override {
    static_cast<void>(bytes);  // the record has the mapped length
    const Mapping mapping = forget(base, /*imported=*/true, "unimport");
    if (mapping.device < 0) return unmapHost(base, mapping.bytes);
    Scope scope(*this, mapping.device);
    const char* call = nullptr;
    if (const CUresult rc = unmap(addressOf(base), mapping.bytes, &call); rc != CUDA_SUCCESS)
      fail(driver_, rc,
           format("unimport(%p, %zu bytes, device %d): %s", base, mapping.bytes, mapping.device,
                  call));
  }

  // braid's own mappings are known exactly. Other pointers are asked about
  // once (cudaPointerGetAttributes) and then remembered: device memory by
  // the whole allocation range the driver reports, host memory per
  // pointer. A foreign allocation that its owner frees and whose address
  // comes back as memory of another kind or device is answered from the
  // cache until the cache fills (as with NCCL's registration cache, a
  // buffer must not change under a communicator that uses it).
  int deviceOf(const void* pointer) override {
    if (!pointer) return -1;
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (const Mapping* mapping = holding(mappings_, address)) return mapping->device;
      if (const Range* range = holding(foreignRanges_, address)) return range->device;
      if (auto it = foreignPointers_.find(address); it != foreignPointers_.end()) return it->second;
    }
    cudaPointerAttributes attributes{};
    if (const cudaError_t rc = cudaPointerGetAttributes(&attributes, pointer); rc != cudaSuccess)
      fail(rc, format("cudaPointerGetAttributes(%p)", pointer));
    // Managed memory counts as memory of the device it was made for.
    const bool onDevice =
        attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
    const int device = onDevice ? attributes.device : -1;
    CUdeviceptr start = 0;
    size_t bytes = 0;
    const bool ranged = onDevice &&
                        driver_.pointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                                    address) == CUDA_SUCCESS &&
                        driver_.pointerGetAttribute(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                                    address) == CUDA_SUCCESS &&
                        bytes > 0 && address - start < bytes;
    std::lock_guard<std::mutex> lock(mutex_);
    if (ranged) {
      if (foreignRanges_.size() >= kMaxCached) foreignRanges_.clear();
      forgetForeignRanges(static_cast<uintptr_t>(start), bytes);  // stale ones it overlaps
      foreignRanges_[static_cast<uintptr_t>(start)] = Range{bytes, device};
    } else {
      if (foreignPointers_.size() >= kMaxCached) foreignPointers_.clear();
      foreignPointers_[address] = device;
    }
    return device;
  }

  // ---- Streams and events.

  StreamHandle createStream(int device) override {
    checkDevice(device, "createStream");
    Scope scope(*this, device);
    cudaStream_t stream = nullptr;
    if (const cudaError_t rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        rc != cudaSuccess)
      fail(rc, format("cudaStreamCreateWithFlags(non-blocking, device %d)", device));
    return stream;
  }

  void destroyStream(StreamHandle stream) override {
    if (const cudaError_t rc = cudaStreamDestroy(streamOf(stream)); rc != cudaSuccess)
      fail(rc, format("cudaStreamDestroy(%p)", stream));
  }

  void synchronize(StreamHandle stream) override {
    if (const cudaError_t rc = cudaStreamSynchronize(streamOf(stream)); rc != cudaSuccess)
      fail(rc, format("cudaStreamSynchronize(%p)", stream));
  }

  // The event belongs to `device`: record it on that device's streams (any
  // stream may wait for it).
  EventHandle createEvent(int device) override {
    checkDevice(device, "createEvent");
    Scope scope(*this, device);
    cudaEvent_t event = nullptr;
    if (const cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        rc != cudaSuccess)
      fail(rc, "cudaEventCreateWithFlags(disable timing)");
    return event;
  }

  void destroyEvent(EventHandle event) override {
    if (const cudaError_t rc = cudaEventDestroy(eventOf(event)); rc != cudaSuccess)
      fail(rc, format("cudaEventDestroy(%p)", event));
  }

  void record(EventHandle event, StreamHandle stream) override {
    if (const cudaError_t rc = cudaEventRecord(eventOf(event), streamOf(stream)); rc != cudaSuccess)
      fail(rc, format("cudaEventRecord(event %p, stream %p)", event, stream));
  }

  void streamWait(StreamHandle stream, EventHandle event) override {
    if (const cudaError_t rc = cudaStreamWaitEvent(streamOf(stream), eventOf(event), 0);
        rc != cudaSuccess)
      fail(rc, format("cudaStreamWaitEvent(stream %p, event %p)", stream, event));
  }

  bool capturing(StreamHandle stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (const cudaError_t rc = cudaStreamIsCapturing(streamOf(stream), &status); rc != cudaSuccess)
      fail(rc, format("cudaStreamIsCapturing(%p)", stream));
    return status != cudaStreamCaptureStatusNone;
  }

  void beginCapture(StreamHandle stream) override {
    Scope scope(*this, deviceOfStream(stream));
    if (const cudaError_t rc =
            cudaStreamBeginCapture(streamOf(stream), cudaStreamCaptureModeThreadLocal);
        rc != cudaSuccess)
      fail(rc, format("cudaStreamBeginCapture(%p)", stream));
  }
  GraphHandle endCapture(StreamHandle stream) override {
    Scope scope(*this, deviceOfStream(stream));
    cudaGraph_t graph = nullptr;
    if (const cudaError_t rc = cudaStreamEndCapture(streamOf(stream), &graph); rc != cudaSuccess)
      fail(rc, format("cudaStreamEndCapture(%p)", stream));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t rc = cudaGraphInstantiate(&exec, graph, 0);
    static_cast<void>(cudaGraphDestroy(graph));  // the instance keeps what it needs
    if (rc != cudaSuccess) fail(rc, "cudaGraphInstantiate");
    return exec;
  }
  void launchGraph(GraphHandle graph, StreamHandle stream) override {
    Scope scope(*this, deviceOfStream(stream));
    if (const cudaError_t rc =
            cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), streamOf(stream));
        rc != cudaSuccess)
      fail(rc, format("cudaGraphLaunch(%p, %p)", graph, stream));
  }
  void destroyGraph(GraphHandle graph) override {
    if (const cudaError_t rc = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
        rc != cudaSuccess)
      fail(rc, format("cudaGraphExecDestroy(%p)", graph));
  }

  bool query(EventHandle event) override {
    const cudaError_t rc = cudaEventQuery(eventOf(event));
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) fail(rc, format("cudaEventQuery(%p)", event));
    static_cast<void>(cudaGetLastError());  // "not ready" is an answer, not a launch's error
    return false;
  }

  // ---- Stream-ordered operations.
  //
  // Hot path: no allocation; a cached deviceOf() per pointer (one lock
  // each), cudaStreamGetDevice and a context check per call.

  // braid's copy kernel where both sides are device memory the stream's
  // device reaches; the copy engines (cudaMemcpyAsync) where host memory
  // is involved or the two devices have no peer access.
  void copy(StreamHandle stream, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    const int device = deviceOfStream(stream);
    const int to = deviceOf(dst);
    const int from = deviceOf(src);
    Scope scope(*this, device);
    if (to >= 0 && from >= 0 && reaches(device, to) && reaches(device, from)) {
      if (const int rc = launchCopy(stream, dst, src, bytes, devices_[device].smCount); rc != 0)
        fail(static_cast<cudaError_t>(rc),
             format("copy kernel (%zu bytes from %p on device %d to %p on device %d, stream of "
                    "device %d)",
                    bytes, src, from, dst, to, device));
      return;
    }
    if (const cudaError_t rc =
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, streamOf(stream));
        rc != cudaSuccess)
      fail(rc, format("cudaMemcpyAsync(%zu bytes from %p to %p, stream of device %d)", bytes, src,
                      dst, device));
  }

  void reduce(StreamHandle stream, const ReduceArgs& args) override {
    checkReduce(args);
    if (args.count == 0) return;
    const int device = deviceOfStream(stream);
    if (count_ > 1) {
      checkReach(device, args.dst);
      for (int i = 0; i < args.inputs; ++i) checkReach(device, args.srcs[i]);
    }
    Scope scope(*this, device);
    if (const int rc = launchReduce(stream, args, devices_[device].smCount); rc != 0)
      fail(static_cast<cudaError_t>(rc),
           format("reduce kernel (%d inputs, %zu x %s, %s, device %d)", args.inputs, args.count,
                  dataTypeName(args.type), reduceOpName(args.op), device));
  }

  // Stream memory operations are always available from CUDA 12 on (the
  // v2 API; CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 is gone), so a
  // batch is always one cuStreamBatchMemOp per kBatchOps operations.
  void flagOps(StreamHandle stream, const FlagOp* ops, size_t count) override {
    if (count == 0) return;
    const int device = deviceOfStream(stream);
    Scope scope(*this, device);
    if (std::any_of(ops, ops + count, [](const FlagOp& op) { return op.polled(); })) {
      if (const int rc = launchPolledFlags(stream, ops, count); rc != 0)
        fail(static_cast<cudaError_t>(rc),
             format("polled flag operations (%zu, stream %p of device %d)", count, stream, device));
      return;
    }
    CUstreamBatchMemOpParams batch[kBatchOps];
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, kBatchOps);
      for (size_t i = 0; i < n; ++i) batch[i] = memOpOf(ops[done + i]);
      const CUresult rc =
          driver_.streamBatchMemOp(streamOf(stream), static_cast<unsigned>(n), batch, 0);
      if (rc != CUDA_SUCCESS)
        fail(driver_, rc,
             format("cuStreamBatchMemOp(%zu of %zu flag operations, stream %p of device %d)", n,
                    count, stream, device));
      done += n;
    }
  }

  // ---- From the host, now: on the flag's device's private stream, which
  // never waits on anything, so a stream blocked on this very flag does not
  // hold the write up. (The streams of a device share its hardware queues,
  // CUDA_DEVICE_MAX_CONNECTIONS of them, 8 unless set: with more busy
  // streams than queues, a blocked one can delay work queued behind it,
  // this stream's included.) Not for hot paths: a stream synchronize each.
  // Flags in host memory (registered or not) are read and written directly.

  void writeFlagNow(uint32_t* flag, uint32_t value) override {
    const int device = deviceOf(flag);
    if (device < 0) {
      __atomic_store_n(flag, value, __ATOMIC_SEQ_CST);
      return;
    }
    Scope scope(*this, device);
    cudaStream_t stream = privateStream(device);
    const CUresult rc =
        driver_.streamWriteValue32(stream, addressOf(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (rc != CUDA_SUCCESS)
      fail(driver_, rc,
           format("writeFlagNow(%p, %u, device %d): cuStreamWriteValue32", static_cast<void*>(flag),
                  value, device));
    finishPrivate(stream, device, "writeFlagNow");
  }

  uint32_t readFlagNow(const uint32_t* flag) override {
    const int device = deviceOf(flag);
    if (device < 0) return __atomic_load_n(flag, __ATOMIC_SEQ_CST);
    uint32_t value = 0;
    transferNow(device, &value, flag, sizeof value, "readFlagNow");
    return value;
  }

  void copyNow(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    int device = deviceOf(dst);
    if (device < 0) device = deviceOf(src);
    if (device < 0) {
      std::memmove(dst, src, bytes);
      return;
    }
    transferNow(device, dst, src, bytes, "copyNow");
  }

 private:
  // One of braid's mappings: memory from allocate() or import().
  struct Mapping {
    size_t bytes = 0;  // mapped length (rounded up to the granularity)
    int device = -1;   // -1: host memory (allocateHost, importHost)
    bool imported = false;
    CUmemGenericAllocationHandle handle = 0;  // allocate(): for exportFd and free; 0 for imports
    int hostFd = -1;                          // allocateHost(): the memfd behind it
  };
  // A foreign allocation's range, as the driver reported it.
  struct Range {
    size_t bytes = 0;
    int device = -1;
  };
  // Per device; the context and the stream are made on first use.
  struct PerDevice {
    int smCount = 1;
    bool rdmaWithVmm = false;  // cuMemCreate can make NIC-registrable (dma-buf) memory
    bool dmabuf = false;       // cuMemGetHandleForAddressRange gives dma-buf fds
    std::once_flag contextOnce;
    CUcontext context = nullptr;  // the primary context, retained
    std::once_flag streamOnce;
    cudaStream_t stream = nullptr;  // private: writeFlagNow, readFlagNow, copyNow, zero-fill
  };

  // Makes `device`'s primary context current for the scope and then
  // restores exactly what was current before, possibly no context at all.
  // Pushing the driver context, rather than cudaSetDevice() there and back,
  // matters: setting back a device the thread never used would create its
  // context (hundreds of MB of GPU memory) in every process. The runtime,
  // braid's and the application's, works on whichever primary context is
  // current.
  class Scope {
   public:
    Scope(CudaDevice& owner, int device) : driver_(owner.driver_) {
      CUcontext wanted = owner.primaryContext(device);
      CUcontext now = nullptr;
      if (driver_.ctxGetCurrent(&now) == CUDA_SUCCESS && now == wanted) return;
      if (const CUresult rc = driver_.ctxPushCurrent(wanted); rc != CUDA_SUCCESS)
        fail(owner.driver_, rc, format("cuCtxPushCurrent(primary context of device %d)", device));
      pushed_ = true;
    }
    ~Scope() {
      CUcontext popped = nullptr;
      if (pushed_) driver_.ctxPopCurrent(&popped);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    // A thread of braid's (the watchdog, a proxy) may call while a user's
    // thread captures in cudaStreamCaptureModeGlobal, which forbids other
    // threads calls such as cudaEventQuery: braid's calls are safe during
    // a capture, so they are made in relaxed mode (first member: restored
    // also when the constructor throws).
    struct RelaxedCapture {
      RelaxedCapture() { static_cast<void>(cudaThreadExchangeStreamCaptureMode(&mode)); }
      ~RelaxedCapture() { static_cast<void>(cudaThreadExchangeStreamCaptureMode(&mode)); }
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // the caller's, while in scope
    } relaxed_;
    const Driver& driver_;
    bool pushed_ = false;
  };

  size_t pair(int device, int peer) const {
    return static_cast<size_t>(device) * static_cast<size_t>(count_) + static_cast<size_t>(peer);
  }

  void checkDevice(int device, const char* what) const {
    if (device < 0 || device >= count_)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: cuda device: %s: device %d does not exist (devices 0 to %d)", what,
                         device, count_ - 1));
  }

  static void checkReduce(const ReduceArgs& args) {
    if (args.inputs < 1 || args.inputs > kMaxReduceInputs)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: cuda device: reduce of %d inputs (1 to %d)", args.inputs,
                         kMaxReduceInputs));
    if (!isValid(args.type) || !isValid(args.op))
      throw Error(ErrorCode::InvalidArgument, "braid: cuda device: reduce: bad type or op");
  }

  // A kernel of `device` touching `pointer` must be able to: its own
  // memory, a peer's with peer access, or host memory (mapped, or reached
  // through the GPU's page tables, which is the caller's business).
  void checkReach(int device, const void* pointer) {
    const int other = deviceOf(pointer);
    if (other < 0 || reaches(device, other)) return;
    throw Error(ErrorCode::InvalidArgument,
                format("braid: cuda device: reduce on a stream of device %d: %p is memory of "
                       "device %d, which device %d has no peer access to",
                       device, pointer, other, device));
  }

  // Whether kernels of `device` can use memory of `other`; enables peer
  // access for the pair the first time (memory from cudaMalloc needs it;
  // braid's own is opened to its peers by cuMemSetAccess already).
  bool reaches(int device, int other) {
    if (other == device) return true;
    if (!canAccessPeer(device, other)) return false;
    std::call_once(peerEnabled_[pair(device, other)], [&] {
      Scope scope(*this, device);
      const cudaError_t rc = cudaDeviceEnablePeerAccess(other, 0);
      if (rc == cudaErrorPeerAccessAlreadyEnabled) {
        static_cast<void>(cudaGetLastError());  // enabled by someone else: fine
      } else if (rc != cudaSuccess) {
        fail(rc, format("cudaDeviceEnablePeerAccess(device %d to device %d)", device, other));
      }
    });
    return true;
  }

  int deviceOfStream(StreamHandle stream) const {
    int device = -1;
    if (const cudaError_t rc = cudaStreamGetDevice(streamOf(stream), &device); rc != cudaSuccess)
      fail(rc, format("cudaStreamGetDevice(%p)", stream));
    return device;
  }

  // A CUdevice is the runtime's device ordinal.
  CUcontext primaryContext(int device) {
    PerDevice& state = devices_[device];
    std::call_once(state.contextOnce, [&] {
      CUcontext context = nullptr;
      if (const CUresult rc = driver_.primaryCtxRetain(&context, device); rc != CUDA_SUCCESS)
        fail(driver_, rc, format("cuDevicePrimaryCtxRetain(device %d)", device));
      state.context = context;
    });
    return state.context;
  }

  // Greatest priority: its work is a few bytes, which should not queue
  // behind bulk kernels. REQUIRES: `device`'s context is current.
  cudaStream_t privateStream(int device) {
    PerDevice& state = devices_[device];
    std::call_once(state.streamOnce, [&] {
      int least = 0, greatest = 0;
      cudaError_t rc = cudaDeviceGetStreamPriorityRange(&least, &greatest);
      if (rc != cudaSuccess)
        fail(rc, format("cudaDeviceGetStreamPriorityRange(device %d)", device));
      cudaStream_t stream = nullptr;
      rc = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest);
      if (rc != cudaSuccess)
        fail(rc, format("cudaStreamCreateWithPriority(non-blocking, device %d)", device));
      state.stream = stream;
    });
    return state.stream;
  }

  // Copies on `device`'s private stream and waits.
  void transferNow(int device, void* dst, const void* src, size_t bytes, const char* what) {
    Scope scope(*this, device);
    cudaStream_t stream = privateStream(device);
    const cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
    if (rc != cudaSuccess)
      fail(rc, format("%s(%zu bytes from %p to %p, device %d): cudaMemcpyAsync", what, bytes, src,
                      dst, device));
    finishPrivate(stream, device, what);
  }

  // Waits for the private stream, at most kPrivateWait: the device may
  // schedule it behind streams blocked on flag waits (the hardware has a
  // bounded number of queues), and the watchdog that calls this to release
  // them must never hang with them.
  void finishPrivate(cudaStream_t stream, int device, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + kPrivateWait;
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady)
        fail(rc, format("%s (device %d): cudaStreamQuery", what, device));
      static_cast<void>(cudaGetLastError());
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(
            ErrorCode::SystemError,
            format("braid: cuda device: %s (device %d) did not run within %lld s: more "
                   "streams may wait on flags than the device has queues (raise "
                   "CUDA_DEVICE_MAX_CONNECTIONS)",
                   what, device,
                   static_cast<long long>(
                       std::chrono::duration_cast<std::chrono::seconds>(kPrivateWait).count())));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  static constexpr auto kPrivateWait = std::chrono::seconds(10);

  // Maps `size` bytes of the memfd `fd` and registers them; nullptr when
  // mmap fails. Throws when registering does.
  void* mapHost(int fd, size_t size, const char* what) {
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return nullptr;
    Scope scope(*this, current());
    if (const cudaError_t rc =
            cudaHostRegister(base, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
        rc != cudaSuccess) {
      ::munmap(base, size);
      fail(rc, format("%s: cudaHostRegister(%zu bytes, portable, mapped)", what, size));
    }
    return base;
  }

  void unmapHost(void* base, size_t size) {
    Scope scope(*this, current());
    const cudaError_t rc = cudaHostUnregister(base);
    ::munmap(base, size);
    if (rc != cudaSuccess) fail(rc, format("cudaHostUnregister(%p, %zu bytes)", base, size));
  }

  CUmemAllocationProp allocationProp(int device) const {
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.allocFlags.gpuDirectRDMACapable = devices_[device].rdmaWithVmm ? 1 : 0;
    return prop;
  }

  size_t granularityOf(const CUmemAllocationProp& prop, CUmemAllocationGranularity_flags which,
                       const std::string& what) const {
    size_t granularity = 0;
    if (const CUresult rc = driver_.memGetAllocationGranularity(&granularity, &prop, which);
        rc != CUDA_SUCCESS)
      fail(driver_, rc, what + ": cuMemGetAllocationGranularity");
    return granularity;
  }

  // `bytes` (0 counts as 1) rounded up to a multiple of `granularity`.
  static size_t roundUp(size_t bytes, size_t granularity, const std::string& what) {
    const size_t wanted = std::max<size_t>(bytes, 1);
    if (wanted > SIZE_MAX - (granularity - 1))
      throw Error(ErrorCode::InvalidArgument, "braid: cuda device: " + what + ": too large");
    return (wanted + granularity - 1) / granularity * granularity;
  }

  // Reserves `size` bytes of address space, maps `handle` there and opens
  // it for reading and writing to `device` and, with `peers`, to every
  // device of this process that has peer access to `device`. On failure it
  // undoes its own steps and returns the failed call's result, naming the
  // call in *call.
  CUresult map(CUmemGenericAllocationHandle handle, size_t size, size_t alignment, int device,
               bool peers, CUdeviceptr* base, const char** call) {
    *call = "cuMemAddressReserve";
    CUresult rc = driver_.memAddressReserve(base, size, alignment, 0, 0);
    if (rc != CUDA_SUCCESS) return rc;
    *call = "cuMemMap";
    rc = driver_.memMap(*base, size, 0, handle, 0);
    if (rc == CUDA_SUCCESS) {
      std::vector<CUmemAccessDesc> access;
      for (int d = 0; d < count_; ++d) {
        if (d != device && !(peers && canAccessPeer(d, device))) continue;
        CUmemAccessDesc desc;
        std::memset(&desc, 0, sizeof desc);
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = d;
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access.push_back(desc);
      }
      *call = "cuMemSetAccess";
      rc = driver_.memSetAccess(*base, size, access.data(), access.size());
      if (rc != CUDA_SUCCESS) driver_.memUnmap(*base, size);
    }
    if (rc != CUDA_SUCCESS) {
      driver_.memAddressFree(*base, size);
      *base = 0;
    }
    return rc;
  }

  // Unmaps and frees the address range; the first failure's result, with
  // the call named in *call.
  CUresult unmap(CUdeviceptr base, size_t size, const char** call) {
    *call = "cuMemUnmap";
    CUresult rc = driver_.memUnmap(base, size);
    const CUresult freed = driver_.memAddressFree(base, size);
    if (rc == CUDA_SUCCESS && freed != CUDA_SUCCESS) {
      rc = freed;
      *call = "cuMemAddressFree";
    }
    return rc;
  }

  // A new mapping changes the address space under the foreign caches:
  // they start again.
  void remember(CUdeviceptr base, const Mapping& mapping) {
    std::lock_guard<std::mutex> lock(mutex_);
    mappings_[static_cast<uintptr_t>(base)] = mapping;
    foreignRanges_.clear();
    foreignPointers_.clear();
  }

  Mapping forget(void* base, bool imported, const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mappings_.find(reinterpret_cast<uintptr_t>(base));
    if (it == mappings_.end() || it->second.imported != imported)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: cuda device: %s: %p is not the start of memory from %s", what,
                         base, imported ? "import()" : "allocate()"));
    const Mapping mapping = it->second;
    mappings_.erase(it);
    return mapping;
  }

  // Drops the cached foreign ranges that overlap [start, start + bytes).
  // REQUIRES: mutex_ held.
  void forgetForeignRanges(uintptr_t start, size_t bytes) {
    auto it = foreignRanges_.lower_bound(start);
    if (it != foreignRanges_.begin()) {
      auto before = std::prev(it);
      if (before->first + before->second.bytes > start) it = before;
    }
    while (it != foreignRanges_.end() && it->first < start + bytes) it = foreignRanges_.erase(it);
  }

  const Driver driver_;
  const int count_;
  const std::unique_ptr<PerDevice[]> devices_;
  std::vector<bool> peerAccess_;  // [pair(device, peer)]: cudaDeviceCanAccessPeer, fixed
  const std::unique_ptr<std::once_flag[]> peerEnabled_;  // [pair(device, peer)]
  std::mutex mutex_;                          // guards mappings_, foreignRanges_, foreignPointers_
  std::map<uintptr_t, Mapping> mappings_;     // by base address
  std::map<uintptr_t, Range> foreignRanges_;  // by range start; at most kMaxCached
  std::unordered_map<uintptr_t, int> foreignPointers_;  // at most kMaxCached
};

// create() without the reason's destination.
std::unique_ptr<Device> tryCreate(std::string* why) {
  // The runtime loads the driver itself, and says only "insufficient
  // driver" when it is missing; asking the dynamic loader first names the
  // cause. The handle stays open: the runtime uses the same library.
  if (!::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    const char* error = ::dlerror();
    *why = format("no CUDA driver (%s)", error ? error : "libcuda.so.1 not found");
    return nullptr;
  }
  int count = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    *why = format("no GPU: cudaGetDeviceCount says %s (%s)", cudaGetErrorString(rc),
                  cudaGetErrorName(rc));
    return nullptr;
  }
  if (count < 1) {
    *why = "no GPU: cudaGetDeviceCount found no device";
    return nullptr;
  }
  Driver driver;
  if (const char* missing = resolve(driver)) {
    int version = 0;
    static_cast<void>(cudaDriverGetVersion(&version));
    *why = format("the CUDA driver (version %d.%d) has no %s, which braid needs", version / 1000,
                  version % 1000 / 10, missing);
    return nullptr;
  }
  try {
    return std::make_unique<CudaDevice>(driver, count);
  } catch (const Error& error) {
    *why = error.what();
    return nullptr;
  }
}

}  // namespace

std::unique_ptr<Device> create(std::string* whyNot) {
  std::string why;
  std::unique_ptr<Device> device = tryCreate(&why);
  if (!device && whyNot) *whyNot = why;
  return device;
}

}  // namespace braid::device::cuda
