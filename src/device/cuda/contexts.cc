// The GPUs of this process: attributes, peer access, primary contexts and
// private streams (contexts.h).
//
// Threading: as contexts.h says; the state made on first use is
// std::call_once, the rest fixed at construction.
#include "device/cuda/contexts.h"

#include <cstring>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::device::cuda {

Contexts::Contexts(const Driver& driver, int count)
    : driver_(driver),
      count_(count),
      devices_(new PerDevice[static_cast<size_t>(count)]),
      peerAccess_(static_cast<size_t>(count) * static_cast<size_t>(count), false),
      peerEnabled_(new std::once_flag[static_cast<size_t>(count) * static_cast<size_t>(count)]) {
  if (const cudaError_t rc = cudaDriverGetVersion(&driverVersion_); rc != cudaSuccess)
    fail(rc, "cudaDriverGetVersion");
  for (int d = 0; d < count_; ++d) {
    query(d);
    for (int peer = 0; peer < count_; ++peer) {
      int can = 1;
      if (peer != d) {
        const cudaError_t rc = cudaDeviceCanAccessPeer(&can, d, peer);
        if (rc != cudaSuccess)
          fail(rc, format("cudaDeviceCanAccessPeer(device %d, peer %d)", d, peer));
      }
      peerAccess_[pair(d, peer)] = can != 0;
    }
  }
}

// Each attribute braid relies on, by the call that reads it: a failure
// names the attribute and the device.
void Contexts::query(int d) {
  Properties& p = devices_[d].properties;
  cudaDeviceProp prop{};
  if (const cudaError_t rc = cudaGetDeviceProperties(&prop, d); rc != cudaSuccess)
    fail(rc, format("cudaGetDeviceProperties(device %d)", d));
  p.name = prop.name;
  std::memcpy(p.uuid.data(), prop.uuid.bytes, p.uuid.size());
  char busId[32] = {};
  if (const cudaError_t rc = cudaDeviceGetPCIBusId(busId, sizeof busId, d); rc != cudaSuccess)
    fail(rc, format("cudaDeviceGetPCIBusId(device %d)", d));
  p.busId = busId;
  p.computeCapability = prop.major * 10 + prop.minor;
  p.multiprocessors = prop.multiProcessorCount;
  p.unifiedAddressing = prop.unifiedAddressing != 0;
  p.pageableMemoryAccess = prop.pageableMemoryAccess != 0;
  auto attribute = [&](CUdevice_attribute which, const char* name, bool optional) {
    int value = 0;
    const CUresult rc = driver_.deviceGetAttribute(&value, which, d);
    if (rc == CUDA_SUCCESS) return value != 0;
    if (optional) return false;  // an older driver that does not know it
    fail(driver_, rc, format("cuDeviceGetAttribute(%s, device %d)", name, d));
  };
  p.virtualMemory = attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                              "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", false);
  p.fdHandles =
      p.virtualMemory && attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                   "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", false);
  p.rdmaWithVmm =
      p.virtualMemory && attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                   "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", false);
  p.dmabuf = p.virtualMemory && driver_.memGetHandleForAddressRange != nullptr &&
             attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "DMA_BUF_SUPPORTED", true);
  if (!p.virtualMemory)
    BRAID_WARN(Init,
               "cuda device %d (%s) has no virtual memory management "
               "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0, as on some virtual "
               "machines and vGPUs): its memory comes from cudaMalloc, which no other process "
               "maps, so FIFOs to other processes are staged through host memory",
               d, p.name.c_str());
  else if (!p.fdHandles)
    BRAID_WARN(Init,
               "cuda device %d (%s) cannot export memory as POSIX file descriptors "
               "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0): FIFOs "
               "to other processes are staged through host memory",
               d, p.name.c_str());
}

std::byte* Contexts::bounce(int device) {
  PerDevice& state = devices_[device];
  std::call_once(state.bounceOnce, [&] {
    void* memory = nullptr;
    if (const cudaError_t rc = cudaHostAlloc(&memory, kBounceBytes, cudaHostAllocPortable);
        rc != cudaSuccess)
      fail(rc,
           format("cudaHostAlloc(%zu bytes of bounce buffer, device %d)", kBounceBytes, device));
    state.bounce = static_cast<std::byte*>(memory);
  });
  return state.bounce;
}

Contexts::~Contexts() {
  for (int d = 0; d < count_; ++d) {
    if (devices_[d].stream) cudaStreamDestroy(devices_[d].stream);
    if (devices_[d].bounce) cudaFreeHost(devices_[d].bounce);
    if (devices_[d].context) driver_.primaryCtxRelease(d);
  }
  static_cast<void>(cudaGetLastError());
}

int Contexts::current() const {
  int device = 0;
  if (const cudaError_t rc = cudaGetDevice(&device); rc != cudaSuccess) fail(rc, "cudaGetDevice");
  return device;
}

void Contexts::checkDevice(int device, const char* what) const {
  if (device < 0 || device >= count_)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: cuda device: %s: device %d does not exist (devices 0 to %d)", what,
                       device, count_ - 1));
}

bool Contexts::canAccessPeer(int device, int peer) const {
  if (device < 0 || device >= count_ || peer < 0 || peer >= count_) return false;
  return peerAccess_[pair(device, peer)];
}

bool Contexts::reaches(int device, int other) {
  if (other == device) return true;
  if (!canAccessPeer(device, other)) return false;
  std::call_once(peerEnabled_[pair(device, other)], [&] {
    ContextScope scope(*this, device);
    const cudaError_t rc = cudaDeviceEnablePeerAccess(other, 0);
    if (rc == cudaErrorPeerAccessAlreadyEnabled) {
      static_cast<void>(cudaGetLastError());  // enabled by someone else: fine
    } else if (rc != cudaSuccess) {
      fail(rc, format("cudaDeviceEnablePeerAccess(device %d to device %d)", device, other));
    }
  });
  return true;
}

// Not cudaStreamGetDevice: the driver refuses it while the stream is being
// captured into a graph, and a refused call invalidates the capture. The
// stream's context, asked for, names the device in capture too.
int Contexts::deviceOfStream(StreamHandle stream) const {
  CUcontext context = nullptr;
  if (const CUresult rc = driver_.streamGetCtx(streamOf(stream), &context); rc != CUDA_SUCCESS)
    fail(driver_, rc, format("cuStreamGetCtx(%p)", stream));
  if (const CUresult rc = driver_.ctxPushCurrent(context); rc != CUDA_SUCCESS)
    fail(driver_, rc, format("cuCtxPushCurrent(the context of stream %p)", stream));
  CUdevice device = -1;
  const CUresult rc = driver_.ctxGetDevice(&device);
  CUcontext popped = nullptr;
  static_cast<void>(driver_.ctxPopCurrent(&popped));
  if (rc != CUDA_SUCCESS)
    fail(driver_, rc, format("cuCtxGetDevice(the context of stream %p)", stream));
  return device;
}

CUcontext Contexts::primaryContext(int device) {
  PerDevice& state = devices_[device];
  std::call_once(state.contextOnce, [&] {
    CUcontext context = nullptr;
    if (const CUresult rc = driver_.primaryCtxRetain(&context, device); rc != CUDA_SUCCESS)
      fail(driver_, rc, format("cuDevicePrimaryCtxRetain(device %d)", device));
    state.context = context;
  });
  return state.context;
}

cudaStream_t Contexts::privateStream(int device) {
  PerDevice& state = devices_[device];
  std::call_once(state.streamOnce, [&] {
    int least = 0, greatest = 0;
    cudaError_t rc = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (rc != cudaSuccess) fail(rc, format("cudaDeviceGetStreamPriorityRange(device %d)", device));
    cudaStream_t stream = nullptr;
    rc = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest);
    if (rc != cudaSuccess)
      fail(rc, format("cudaStreamCreateWithPriority(non-blocking, device %d)", device));
    state.stream = stream;
  });
  return state.stream;
}

ContextScope::ContextScope(Contexts& contexts, int device) : driver_(contexts.driver()) {
  CUcontext wanted = contexts.primaryContext(device);
  CUcontext now = nullptr;
  if (driver_.ctxGetCurrent(&now) == CUDA_SUCCESS && now == wanted) return;
  if (const CUresult rc = driver_.ctxPushCurrent(wanted); rc != CUDA_SUCCESS)
    fail(driver_, rc, format("cuCtxPushCurrent(primary context of device %d)", device));
  pushed_ = true;
}

ContextScope::~ContextScope() {
  CUcontext popped = nullptr;
  if (pushed_) driver_.ctxPopCurrent(&popped);
}

}  // namespace braid::device::cuda
