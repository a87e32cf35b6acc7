// The driver's entry points and the naming of CUDA failures (driver.h).
//
// Threading: resolve() fills the table it is given and nothing else; the
// rest reads only its arguments.
#include "device/cuda/driver.h"

#include <type_traits>

#include "braid/error.h"
#include "core/errors.h"
#include "device/cuda/entry_points.h"

namespace braid::device::cuda {

const char* resolve(Driver& d) {
  const char* missing = nullptr;
  auto get = [&missing](const char* symbol, auto& slot) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    // At the version of the ABI cuda.h declares (entry_points.h), not the
    // toolkit's: a driver older than the toolkit has it too.
    const cudaError_t rc = cudaGetDriverEntryPointByVersion(
        symbol, &function, static_cast<unsigned>(entryPointVersion(symbol)), cudaEnableDefault,
        &found);
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
  get("cuCtxGetDevice", d.ctxGetDevice);
  get("cuStreamGetCtx", d.streamGetCtx);
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

void fail(cudaError_t rc, const std::string& call) {
  static_cast<void>(cudaGetLastError());
  throw Error(ErrorCode::SystemError, format("braid: cuda device: %s: %s (%s)", call.c_str(),
                                             cudaGetErrorString(rc), cudaGetErrorName(rc)));
}

void fail(const Driver& driver, CUresult rc, const std::string& call) {
  const std::string name = errorName(driver, rc);
  const char* text = nullptr;
  if (driver.getErrorString(rc, &text) != CUDA_SUCCESS) text = nullptr;
  throw Error(ErrorCode::SystemError, format("braid: cuda device: %s: %s (%s)", call.c_str(),
                                             text ? text : "unknown error", name.c_str()));
}

std::string errorName(const Driver& driver, CUresult rc) {
  const char* name = nullptr;
  if (driver.getErrorName(rc, &name) != CUDA_SUCCESS) name = nullptr;
  return name ? name : std::to_string(static_cast<int>(rc));
}

}  // namespace braid::device::cuda
