// The GPUs of this process: attributes, peer access, primary contexts and
// private streams (contexts.h).
//
// Threading: as contexts.h says; the state made on first use is
// std::call_once, the rest fixed at construction.
#include "device/cuda/contexts.h"

#include "braid/error.h"
#include "core/errors.h"

namespace braid::device::cuda {

Contexts::Contexts(const Driver& driver, int count)
    : driver_(driver),
      count_(count),
      devices_(new PerDevice[static_cast<size_t>(count)]),
      peerAccess_(static_cast<size_t>(count) * static_cast<size_t>(count), false),
      peerEnabled_(new std::once_flag[static_cast<size_t>(count) * static_cast<size_t>(count)]) {
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
    int pageable = 0;
    if (cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, d) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      pageable = 0;
    }
    device.pageable = pageable != 0;
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

Contexts::~Contexts() {
  for (int d = 0; d < count_; ++d) {
    if (devices_[d].stream) cudaStreamDestroy(devices_[d].stream);
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

int Contexts::deviceOfStream(StreamHandle stream) const {
  int device = -1;
  if (const cudaError_t rc = cudaStreamGetDevice(streamOf(stream), &device); rc != cudaSuccess)
    fail(rc, format("cudaStreamGetDevice(%p)", stream));
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
