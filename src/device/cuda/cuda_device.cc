// The CUDA device itself: the Device interface over the pieces of this
// folder, each a concern of its own, and create(), which finds out whether
// CUDA can be used in this process at all.
//
// Threading: every method may be called from any thread; the pieces state
// their own contracts (the MemoryMap locks, the Contexts' state made on
// first use is std::call_once, the rest is fixed at construction).
#include "device/cuda/cuda_device.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <memory>
#include <string>

#include "braid/error.h"
#include "core/errors.h"
#include "device/cuda/contexts.h"
#include "device/cuda/driver.h"
#include "device/cuda/entry_points.h"
#include "device/cuda/host_memory.h"
#include "device/cuda/memory_map.h"
#include "device/cuda/streams.h"
#include "device/cuda/vmm_memory.h"

namespace braid::device::cuda {
namespace {

// Delegates: device memory to VmmMemory, page-locked host memory to
// HostMemory, the record of both and pointer classification to MemoryMap,
// streams and the work on them to Streams; all share the Contexts. Memory
// still allocated or imported at destruction stays mapped; the process's
// end releases it.
class CudaDevice final : public Device {
 public:
  // Throws Error(SystemError) when a device's attributes cannot be read.
  CudaDevice(const Driver& driver, int count)
      : contexts_(driver, count),
        memory_(contexts_.driver()),
        vmm_(contexts_, memory_),
        host_(contexts_, memory_),
        streams_(contexts_, memory_) {}

  const char* name() const override { return "cuda"; }
  int count() const override { return contexts_.count(); }
  int current() const override { return contexts_.current(); }

  void setCurrent(int device) override {
    contexts_.checkDevice(device, "setCurrent");
    if (const cudaError_t rc = cudaSetDevice(device); rc != cudaSuccess)
      fail(rc, format("cudaSetDevice(%d)", device));
  }

  bool canAccessPeer(int device, int peer) const override {
    return contexts_.canAccessPeer(device, peer);
  }
  const Properties& properties(int device) const override {
    contexts_.checkDevice(device, "properties");
    return contexts_.properties(device);
  }
  int driverVersion() const override { return contexts_.driverVersion(); }

  // ---- Memory: device memory from VmmMemory, host memory from HostMemory;
  // the MemoryMap's record says which an address is.

  void* allocate(int device, size_t bytes) override { return vmm_.allocate(device, bytes); }
  void* allocateHost(size_t bytes) override { return host_.allocate(bytes); }
  void* importHost(int fd, size_t bytes) override { return host_.import(fd, bytes); }
  void* import(int fd, size_t bytes, int device) override { return vmm_.import(fd, bytes, device); }

  void free(void* base) override {
    const Mapping mapping = memory_.forget(base, /*imported=*/false, "free");
    if (mapping.device < 0) return host_.free(base, mapping);
    vmm_.free(base, mapping);
  }

  void unimport(void* base, size_t bytes) override {
    static_cast<void>(bytes);  // the record has the mapped length
    const Mapping mapping = memory_.forget(base, /*imported=*/true, "unimport");
    if (mapping.device < 0) return host_.unimport(base, mapping);
    vmm_.unimport(base, mapping);
  }

  int exportFd(const void* base) override {
    Mapping mapping;
    if (!memory_.find(base, &mapping) || mapping.imported)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: cuda device: exportFd: %p is not the start of memory from "
                         "allocate()",
                         base));
    if (mapping.device < 0) return host_.exportFd(base, mapping);  // staging memory: its memfd
    return vmm_.exportFd(base, mapping);
  }

  int exportDmabuf(const void* base, size_t bytes, uint64_t* offset, std::string* whyNot) override {
    return vmm_.exportDmabuf(base, bytes, offset, whyNot);
  }

  int deviceOf(const void* pointer) override { return memory_.deviceOf(pointer); }

  // ---- Streams, events, graphs and stream-ordered operations.

  StreamHandle createStream(int device) override { return streams_.createStream(device); }
  void destroyStream(StreamHandle stream) override { streams_.destroyStream(stream); }
  void synchronize(StreamHandle stream) override { streams_.synchronize(stream); }
  EventHandle createEvent(int device) override { return streams_.createEvent(device); }
  void destroyEvent(EventHandle event) override { streams_.destroyEvent(event); }
  void record(EventHandle event, StreamHandle stream) override { streams_.record(event, stream); }
  void streamWait(StreamHandle stream, EventHandle event) override {
    streams_.streamWait(stream, event);
  }
  bool query(EventHandle event) override { return streams_.query(event); }
  bool capturing(StreamHandle stream) override { return streams_.capturing(stream); }

  void beginCapture(StreamHandle stream) override { streams_.beginCapture(stream); }
  GraphHandle endCapture(StreamHandle stream) override { return streams_.endCapture(stream); }
  void launchGraph(GraphHandle graph, StreamHandle stream) override {
    streams_.launchGraph(graph, stream);
  }
  void destroyGraph(GraphHandle graph) override { streams_.destroyGraph(graph); }

  void copy(StreamHandle stream, void* dst, const void* src, size_t bytes) override {
    streams_.copy(stream, dst, src, bytes);
  }
  void reduce(StreamHandle stream, const ReduceArgs& args) override {
    streams_.reduce(stream, args);
  }
  void flagOps(StreamHandle stream, const FlagOp* ops, size_t count) override {
    streams_.flagOps(stream, ops, count);
  }

  void writeFlagNow(uint32_t* flag, uint32_t value) override { streams_.writeFlagNow(flag, value); }
  uint32_t readFlagNow(const uint32_t* flag) override { return streams_.readFlagNow(flag); }
  void copyNow(void* dst, const void* src, size_t bytes) override {
    streams_.copyNow(dst, src, bytes);
  }

 private:
  // Declared first: destroyed last, after the pieces that refer to it.
  Contexts contexts_;
  MemoryMap memory_;
  VmmMemory vmm_;
  HostMemory host_;
  Streams streams_;
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
  int version = 0;
  static_cast<void>(cudaDriverGetVersion(&version));
  if (const std::string old = tooOldFor(version); !old.empty()) {
    *why = format("the CUDA driver (version %d.%d) is older than braid needs: %s", version / 1000,
                  version % 1000 / 10, old.c_str());
    return nullptr;
  }
  Driver driver;
  if (const char* missing = resolve(driver)) {
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
