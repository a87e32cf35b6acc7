// The driver entry points braid calls, each with the version of its ABI
// (entry_points.h).
#include "device/cuda/entry_points.h"

#include <cstdio>
#include <iterator>

namespace braid::device::cuda {
namespace {

// The version is the one whose ABI cuda.h's name maps to: the _v2 of
// cuCtxPushCurrent (4.0) and cuDevicePrimaryCtxRelease (11.0), virtual
// memory management (10.2), the stream memory operations' second ABI, the
// default name from 12.0 (their parameter struct changed then).
constexpr EntryPoint kEntryPoints[] = {
    {"cuGetErrorName", 6000, false},
    {"cuGetErrorString", 6000, false},
    {"cuDeviceGetAttribute", 2000, false},
    {"cuDevicePrimaryCtxRetain", 7000, false},
    {"cuDevicePrimaryCtxRelease", 11000, false},
    {"cuCtxGetCurrent", 4000, false},
    {"cuCtxPushCurrent", 4000, false},
    {"cuCtxPopCurrent", 4000, false},
    {"cuCtxGetDevice", 2000, false},
    {"cuStreamGetCtx", 9020, false},
    {"cuMemGetAllocationGranularity", 10020, false},
    {"cuMemCreate", 10020, false},
    {"cuMemRelease", 10020, false},
    {"cuMemAddressReserve", 10020, false},
    {"cuMemAddressFree", 10020, false},
    {"cuMemMap", 10020, false},
    {"cuMemUnmap", 10020, false},
    {"cuMemSetAccess", 10020, false},
    {"cuMemExportToShareableHandle", 10020, false},
    {"cuMemImportFromShareableHandle", 10020, false},
    {"cuPointerGetAttribute", 4000, false},
    {"cuStreamWriteValue32", 12000, false},
    {"cuStreamBatchMemOp", 12000, false},
    // GPUDirect RDMA through dma-buf.
    {"cuMemGetHandleForAddressRange", 11070, true},
};

}  // namespace

const EntryPoint* entryPoints(size_t* count) {
  *count = std::size(kEntryPoints);
  return kEntryPoints;
}

int entryPointVersion(std::string_view name) {
  for (const EntryPoint& entry : kEntryPoints)
    if (name == entry.name) return entry.version;
  return 0;
}

std::string tooOldFor(int driverVersion) {
  for (const EntryPoint& entry : kEntryPoints)
    if (!entry.optional && entry.version > driverVersion) {
      char text[96];
      std::snprintf(text, sizeof(text), "%s (CUDA %d.%d)", entry.name, entry.version / 1000,
                    entry.version % 1000 / 10);
      return text;
    }
  return "";
}

}  // namespace braid::device::cuda
