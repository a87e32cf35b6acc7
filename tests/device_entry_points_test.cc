// The versions braid asks the CUDA driver's entry points at
// (src/device/cuda/entry_points.h). Free of CUDA, so these run on every
// machine, with or without a GPU:
//
// - each function is asked at the version of the ABI cuda.h declares, never
//   at the toolkit's: a 13.x build finds every function on a 13.0 driver,
//   and on any driver from 12.0 on;
// - a driver older than one the required functions need is named with the
//   first such function and its version; an optional one never makes a
//   driver too old;
// - every function appears once, with a version CUDA had.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "device/cuda/entry_points.h"

namespace braid::device::cuda {
namespace {

TEST(DriverEntryPoints, ABuildOfANewerToolkitFindsEveryFunctionOnA12Or13Driver) {
  EXPECT_EQ(tooOldFor(13000), "") << "a 13.0 driver";
  EXPECT_EQ(tooOldFor(12000), "") << "a 12.0 driver";
  size_t count = 0;
  const EntryPoint* entries = entryPoints(&count);
  for (size_t i = 0; i < count; ++i)
    EXPECT_LE(entries[i].version, 12000) << entries[i].name << " is asked at a toolkit's version";
}

TEST(DriverEntryPoints, ADriverTooOldIsNamedWithTheFirstFunctionItLacks) {
  EXPECT_EQ(tooOldFor(11080), "cuStreamWriteValue32 (CUDA 12.0)");
  EXPECT_EQ(tooOldFor(10010), "cuDevicePrimaryCtxRelease (CUDA 11.0)");
  // cuMemGetHandleForAddressRange (11.7) is optional: an 11.6 driver is too
  // old for the stream operations, not for it.
  EXPECT_EQ(entryPointVersion("cuMemGetHandleForAddressRange"), 11070);
  EXPECT_EQ(tooOldFor(11060), "cuStreamWriteValue32 (CUDA 12.0)");
}

TEST(DriverEntryPoints, EachFunctionIsAskedAtTheVersionOfItsDeclaredAbi) {
  EXPECT_EQ(entryPointVersion("cuCtxPushCurrent"), 4000);            // cuCtxPushCurrent_v2
  EXPECT_EQ(entryPointVersion("cuDevicePrimaryCtxRelease"), 11000);  // _v2
  EXPECT_EQ(entryPointVersion("cuMemCreate"), 10020);                // virtual memory management
  EXPECT_EQ(entryPointVersion("cuStreamBatchMemOp"), 12000);         // the v2 parameters
  EXPECT_EQ(entryPointVersion("cuStreamGetCtx"), 9020);  // not _v2 (12.5: green contexts)
  EXPECT_EQ(entryPointVersion("cuLaunchKernel"), 0) << "not one braid resolves";
  size_t count = 0;
  const EntryPoint* entries = entryPoints(&count);
  std::set<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    EXPECT_TRUE(names.insert(entries[i].name).second) << entries[i].name << " twice";
    EXPECT_GE(entries[i].version, 2000) << entries[i].name;
    EXPECT_EQ(entries[i].version % 10, 0) << entries[i].name;
  }
  EXPECT_EQ(count, 24u);
}

}  // namespace
}  // namespace braid::device::cuda
