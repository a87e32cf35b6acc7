// The device seam for programs that know only NCCL's API: a C program built
// against NCCL's own nccl.h makes its streams and moves its data with CUDA,
// which the emulated device is not. These functions do it on whatever
// device braid uses (BRAID_DEVICE), so such a program runs on the emulated
// device too; it finds them with dlsym(RTLD_DEFAULT, ...) (libnccl.so.2
// loads libbraid) and falls back to CUDA where they are missing. Each
// returns 0, 1 when braid has no device (the reason is logged once), or 2
// when the device refused (the error is logged).
#include <cstddef>
#include <exception>

#include "core/log.h"
#include "device/device.h"

namespace {

braid::device::Device* deviceOrNull() {
  braid::device::Device* device = braid::device::current();
  if (!device) {
    static bool said = false;
    if (!said)
      BRAID_WARN(Init, "no device for a program: %s", braid::device::unavailableReason().c_str());
    said = true;
  }
  return device;
}

template <typename Call>
int guarded(const char* name, Call&& call) {
  braid::device::Device* device = deviceOrNull();
  if (!device) return 1;
  try {
    call(*device);
    return 0;
  } catch (const std::exception& error) {
    BRAID_WARN(Init, "%s: %s", name, error.what());
    return 2;
  }
}

}  // namespace

extern "C" {

// cudaSetDevice.
int braidDeviceSetCurrent(int device) {
  return guarded("braidDeviceSetCurrent", [&](braid::device::Device& d) { d.setCurrent(device); });
}

// cudaStreamCreate, on the calling thread's current device.
int braidDeviceStreamCreate(void** stream) {
  return guarded("braidDeviceStreamCreate",
                 [&](braid::device::Device& d) { *stream = d.createStream(d.current()); });
}

// cudaStreamSynchronize.
int braidDeviceStreamSynchronize(void* stream) {
  return guarded("braidDeviceStreamSynchronize",
                 [&](braid::device::Device& d) { d.synchronize(stream); });
}

// cudaStreamDestroy.
int braidDeviceStreamDestroy(void* stream) {
  return guarded("braidDeviceStreamDestroy",
                 [&](braid::device::Device& d) { d.destroyStream(stream); });
}

// cudaMemcpy (any direction), waiting for it.
int braidDeviceCopy(void* dst, const void* src, size_t bytes) {
  return guarded("braidDeviceCopy", [&](braid::device::Device& d) { d.copyNow(dst, src, bytes); });
}

}  // extern "C"
