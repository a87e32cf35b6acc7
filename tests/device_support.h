// Device buffers and streams for tests, through the device seam, as a CUDA
// program uses cudaMalloc memory and a cudaStream_t.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "device/device.h"
#include "multirank.h"

namespace braid::testing {

// Why `backend` cannot run here ("" when it can), asked in a child process:
// the process that forks the ranks must not start CUDA itself.
inline std::string unavailable(const std::string& backend) {
  static std::map<std::string, std::string> known;
  if (auto it = known.find(backend); it != known.end()) return it->second;
  return known[backend] = askInChild([&] {
           device::select(backend);
           return device::unavailableReason();
         });
}

// Device memory of the communicator's device, filled from and read back
// into host vectors.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes)
      : device_(device::require("DeviceBuffer")),
        bytes_(bytes),
        data_(static_cast<std::byte*>(device_.allocate(device, std::max<size_t>(bytes, 1)))) {}
  ~DeviceBuffer() { device_.free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::byte* data() { return data_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host) { device_.copyNow(data_, host, bytes_); }
  void upload(const std::vector<std::byte>& host) { upload(host.data()); }
  std::vector<std::byte> download() const {
    std::vector<std::byte> host(bytes_);
    device_.copyNow(host.data(), data_, bytes_);
    return host;
  }

 private:
  device::Device& device_;
  size_t bytes_;
  std::byte* data_;
};

// A stream of the device, destroyed at the end of the scope.
class TestStream {
 public:
  explicit TestStream(int device)
      : device_(device::require("TestStream")), handle_(device_.createStream(device)) {}
  ~TestStream() { device_.destroyStream(handle_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  Stream stream() const { return Stream::cuda(handle_); }
  device::StreamHandle handle() const { return handle_; }
  void synchronize() { device_.synchronize(handle_); }

 private:
  device::Device& device_;
  device::StreamHandle handle_;
};

// Holds a stream: everything queued on it after hold() waits until release().
class StreamHold {
 public:
  explicit StreamHold(int device) : flag_(device, sizeof(uint32_t)) {
    const uint32_t zero = 0;
    flag_.upload(&zero);
  }
  void hold(TestStream& stream) {
    const device::FlagOp wait = device::FlagOp::wait(flagWord(), 1);
    device::current()->flagOps(stream.handle(), &wait, 1);
  }
  void release() { device::current()->writeFlagNow(flagWord(), 1); }

 private:
  uint32_t* flagWord() { return reinterpret_cast<uint32_t*>(flag_.data()); }
  DeviceBuffer flag_;
};

}  // namespace braid::testing
