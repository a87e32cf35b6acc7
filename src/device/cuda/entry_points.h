// Which version of each driver entry point braid asks for (driver.cc).
//
// The driver keeps every ABI a function ever had, and hands out the one of
// the CUDA version it is asked at. braid asks for each function at the
// version that introduced the signature its cuda.h declares (as NCCL's own
// wrappers do), not at the toolkit's version: a driver older than the
// toolkit that built braid still has every function braid calls, and
// answers for all of them. Free of CUDA, so that tests run it anywhere.
#pragma once

#include <string>
#include <string_view>

namespace braid::device::cuda {

struct EntryPoint {
  const char* name;  // as cuda.h names it, e.g. "cuMemCreate"
  int version;       // CUDA version of its ABI, as cudaDriverGetVersion writes one (12000)
  bool optional;     // braid runs without it (a feature is off)
};

// Every entry point braid resolves, in the order driver.cc resolves them.
const EntryPoint* entryPoints(size_t* count);

// The version to ask `name` at; 0 for a function braid does not resolve.
int entryPointVersion(std::string_view name);

// The first required entry point a driver of `driverVersion` is too old
// for, as "cuStreamBatchMemOp (CUDA 12.0)"; "" when it has them all.
std::string tooOldFor(int driverVersion);

}  // namespace braid::device::cuda
