// The CUDA driver as the CUDA device reaches it: the table of driver entry
// points braid calls, obtained from the runtime at the ABI of the headers
// they are declared in (cudaGetDriverEntryPointByVersion, each at the
// version entry_points.h gives it),
// so that libbraid never links libcuda and loads and runs host collectives
// where there is no driver; the failures of runtime and driver calls as
// braid's Error; and the casts between the seam's opaque handles and CUDA's
// types.
//
// Threading: a Driver is filled once by resolve() and read-only after; any
// thread may read it and call everything here.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "device/device.h"

namespace braid::device::cuda {

// The driver functions braid calls. Filled once by resolve(), read-only
// after.
struct Driver {
  decltype(&::cuGetErrorName) getErrorName = nullptr;
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primaryCtxRelease = nullptr;
  decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
  decltype(&::cuCtxPushCurrent) ctxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) ctxPopCurrent = nullptr;
  decltype(&::cuCtxGetDevice) ctxGetDevice = nullptr;
  decltype(&::cuStreamGetCtx) streamGetCtx = nullptr;
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
// nullptr when it has them all (the optional ones may stay null).
const char* resolve(Driver& d);

// Throws Error(SystemError) for a failed runtime call; `call` names it and
// the arguments that matter. The runtime also keeps the failure as the
// thread's last error, which braid's kernel launches return
// (cudaGetLastError in kernels.cu): it is consumed here, so that the next
// launch does not report it as its own. (Sticky errors stay: the context is
// lost then.)
[[noreturn]] void fail(cudaError_t rc, const std::string& call);

// Throws Error(SystemError) for a failed driver call, as fail(cudaError_t).
[[noreturn]] void fail(const Driver& driver, CUresult rc, const std::string& call);

// The driver's name for `rc` (CUDA_ERROR_...), or its number where the
// driver has no name for it.
std::string errorName(const Driver& driver, CUresult rc);

inline cudaStream_t streamOf(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }
inline cudaEvent_t eventOf(EventHandle event) { return static_cast<cudaEvent_t>(event); }
inline CUdeviceptr addressOf(const void* pointer) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(pointer));
}
inline void* pointerOf(CUdeviceptr address) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a CUdeviceptr is an address
  return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
}

}  // namespace braid::device::cuda
