// braid-info --device: the device braid would use, what it is, and every
// call of the device seam (device/device.h) made once on its own, in the
// order braid depends on them, each checked. The first call that fails
// ends the probe, named with the error it raised (for CUDA, the driver or
// runtime call and its error name): the calls after it need what it makes.
#include "tools/device_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "device/device.h"

namespace braid::tools {
namespace {

using device::Device;

const char* yesNo(bool value) { return value ? "yes" : "no"; }

void printProperties(const Device& device, int d) {
  const device::Properties& p = device.properties(d);
  std::printf("device %d: %s\n", d, p.name.c_str());
  std::printf("  uuid                  %s\n", device::uuidText(p.uuid).c_str());
  std::printf("  pci bus id            %s\n", p.busId.empty() ? "(none)" : p.busId.c_str());
  std::printf("  compute capability    %d.%d\n", p.computeCapability / 10,
              p.computeCapability % 10);
  std::printf("  multiprocessors       %d\n", p.multiprocessors);
  std::printf("  virtual memory mgmt   %s\n", yesNo(p.virtualMemory));
  std::printf("  POSIX-fd handles      %s\n", yesNo(p.fdHandles));
  std::printf("  dma-buf export        %s\n", yesNo(p.dmabuf));
  std::printf("  GPUDirect RDMA (VMM)  %s\n", yesNo(p.rdmaWithVmm));
  std::printf("  unified addressing    %s\n", yesNo(p.unifiedAddressing));
  std::printf("  pageable memory       %s\n", yesNo(p.pageableMemoryAccess));
  std::printf("  peer access to        ");
  for (int peer = 0; peer < device.count(); ++peer)
    if (peer != d && device.canAccessPeer(d, peer)) std::printf("%d ", peer);
  std::printf("\n");
}

// Runs the probe's calls in order, one line each; the first that throws or
// whose check fails ends it.
class Probe {
 public:
  // Runs `call`; it returns "" when its check passed, else what was wrong.
  bool step(const std::string& name, const std::function<std::string()>& call) {
    if (failed_) return false;
    const auto start = std::chrono::steady_clock::now();
    std::string problem;
    try {
      problem = call();
    } catch (const std::exception& error) {
      problem = error.what();
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (problem.empty()) {
      std::printf("  ok      %-50s %10.1f us\n", name.c_str(), us);
    } else {
      std::printf("  FAILED  %s: %s\n", name.c_str(), problem.c_str());
      failed_ = true;
    }
    std::fflush(stdout);
    return !failed_;
  }
  bool failed() const { return failed_; }

 private:
  bool failed_ = false;
};

// Every seam call on device `d`. Leaves nothing allocated when it passes.
bool probeDevice(Device& device, int d) {
  constexpr size_t kBytes = size_t{2} << 20;
  constexpr size_t kFloats = kBytes / sizeof(float);
  Probe probe;
  std::printf("seam calls on device %d:\n", d);
  void* a = nullptr;
  void* b = nullptr;
  void* host = nullptr;
  device::StreamHandle stream = nullptr, other = nullptr;
  device::EventHandle event = nullptr;
  std::vector<float> pattern(kFloats), back(kFloats);
  for (size_t i = 0; i < kFloats; ++i) pattern[i] = static_cast<float>(i % 1000);
  auto flags = [&] { return static_cast<uint32_t*>(host); };

  probe.step(format("setCurrent(%d)", d), [&] {
    device.setCurrent(d);
    return device.current() == d ? "" : format("current() is %d", device.current());
  });
  probe.step("allocate(2 MiB) x 2", [&] {
    a = device.allocate(d, kBytes);
    b = device.allocate(d, kBytes);
    return std::string();
  });
  probe.step("allocateHost(64 KiB)", [&] {
    host = device.allocateHost(64 << 10);
    return std::string();
  });
  probe.step("deviceOf", [&] {
    const int ofA = device.deviceOf(a), ofHost = device.deviceOf(host);
    const int ofHeap = device.deviceOf(pattern.data());
    return ofA == d && ofHost == -1 && ofHeap == -1
               ? std::string()
               : format("device memory is %d, page-locked host %d, heap %d", ofA, ofHost, ofHeap);
  });
  probe.step("copyNow host -> device -> host", [&] {
    device.copyNow(a, pattern.data(), kBytes);
    device.copyNow(back.data(), a, kBytes);
    return back == pattern ? "" : std::string("the bytes came back changed");
  });
  probe.step("writeFlagNow, readFlagNow", [&] {
    auto* flag = static_cast<uint32_t*>(b);
    device.writeFlagNow(flag, 0x5eed);
    const uint32_t read = device.readFlagNow(flag);
    return read == 0x5eed ? "" : format("wrote 0x5eed, read 0x%x", read);
  });
  probe.step("createStream x 2, createEvent", [&] {
    stream = device.createStream(d);
    other = device.createStream(d);
    event = device.createEvent(d);
    return std::string();
  });
  probe.step("copy (stream), synchronize", [&] {
    device.copy(stream, b, a, kBytes);
    device.synchronize(stream);
    std::fill(back.begin(), back.end(), 0.0f);
    device.copyNow(back.data(), b, kBytes);
    return back == pattern ? "" : std::string("the copy differs");
  });
  probe.step("reduce (kernel: 2 x float32 sum), record, query", [&] {
    device::ReduceArgs args;
    args.dst = b;
    args.srcs[0] = a;
    args.srcs[1] = b;
    args.inputs = 2;
    args.count = kFloats;
    device.reduce(stream, args);
    device.record(event, stream);
    device.synchronize(stream);
    if (!device.query(event)) return std::string("the event did not complete after synchronize");
    device.copyNow(back.data(), b, kBytes);
    for (size_t i = 0; i < kFloats; ++i)
      if (back[i] != 2 * pattern[i])
        return format("element %zu is %g, not %g", i, back[i], 2 * pattern[i]);
    return std::string();
  });
  probe.step("reduce of page-locked host memory", [&] {
    device.copyNow(host, pattern.data(), 4096);
    device::ReduceArgs args;
    args.dst = a;
    args.srcs[0] = host;
    args.srcs[1] = host;
    args.inputs = 2;
    args.count = 1024;
    device.reduce(stream, args);
    device.synchronize(stream);
    device.copyNow(back.data(), a, 4096);
    for (size_t i = 0; i < 1024; ++i)
      if (back[i] != 2 * pattern[i]) return format("element %zu is %g", i, back[i]);
    device.copyNow(a, pattern.data(), kBytes);
    return std::string();
  });
  probe.step("flagOps (stream memory ops: write, wait)", [&] {
    uint32_t* flag = flags();
    device.writeFlagNow(flag, 0);
    const device::FlagOp ops[] = {device::FlagOp::write(flag + 1, 3),
                                  device::FlagOp::wait(flag + 1, 3)};
    device.flagOps(stream, ops, 2);
    device.synchronize(stream);
    const uint32_t read = device.readFlagNow(flag + 1);
    return read == 3 ? "" : format("the flag is %u, not 3", read);
  });
  probe.step("flagOps (kernel: add, relative wait)", [&] {
    auto* counter = static_cast<uint32_t*>(b);
    device.writeFlagNow(counter, 5);
    const device::FlagOp ops[] = {
        device::FlagOp::add(counter, 2),
        device::FlagOp::wait(counter, 0, device::Compare::Equal, counter)};
    device.flagOps(stream, ops, 2);
    device.synchronize(stream);
    const uint32_t read = device.readFlagNow(counter);
    return read == 7 ? "" : format("the counter is %u, not 7", read);
  });
  probe.step("a host write releases a stream's flag wait", [&] {
    uint32_t* flag = flags() + 2;
    device.writeFlagNow(flag, 0);
    const device::FlagOp wait = device::FlagOp::wait(flag, 1);
    device.flagOps(other, &wait, 1);
    device.record(event, other);
    ::usleep(20'000);
    if (device.query(event)) return std::string("the wait passed before the flag was written");
    device.writeFlagNow(flag, 1);
    device.synchronize(other);
    return std::string();
  });
  probe.step("streamWait (event)", [&] {
    device.record(event, stream);
    device.streamWait(other, event);
    device.synchronize(other);
    return std::string();
  });
  probe.step("capturing, beginCapture, endCapture, launchGraph", [&] {
    if (device.capturing(stream)) return std::string("a fresh stream says it is capturing");
    device.beginCapture(stream);
    if (!device.capturing(stream)) {
      static_cast<void>(device.endCapture(stream));
      return std::string("capturing() is false during a capture");
    }
    device.copy(stream, b, a, kBytes);
    device::GraphHandle graph = device.endCapture(stream);
    device.copyNow(b, std::vector<float>(kFloats, 0.0f).data(), kBytes);
    device.launchGraph(graph, stream);
    device.synchronize(stream);
    device.destroyGraph(graph);
    device.copyNow(back.data(), b, kBytes);
    return back == pattern ? "" : std::string("the replayed copy differs");
  });
  probe.step("exportFd, import, unimport (device memory)", [&] {
    if (!device.properties(d).fdHandles)
      return std::string();  // said in the properties; braid stages instead
    const int fd = device.exportFd(a);
    void* mapped = nullptr;
    try {
      mapped = device.import(fd, kBytes, d);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    std::fill(back.begin(), back.end(), 0.0f);
    device.copyNow(back.data(), mapped, kBytes);
    device.unimport(mapped, kBytes);
    return back == pattern ? "" : std::string("the imported mapping reads other bytes");
  });
  probe.step("exportFd, importHost, unimport (host memory)", [&] {
    const int fd = device.exportFd(host);
    void* mapped = nullptr;
    try {
      mapped = device.importHost(fd, 64 << 10);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    const bool same = std::memcmp(mapped, host, 4096) == 0;
    device.unimport(mapped, 64 << 10);
    return same ? "" : std::string("the imported mapping reads other bytes");
  });
  probe.step("exportDmabuf", [&] {
    uint64_t offset = 0;
    std::string whyNot;
    const int fd = device.exportDmabuf(a, kBytes, &offset, &whyNot);
    if (fd >= 0)
      ::close(fd);
    else
      std::printf("          (no dma-buf: %s)\n", whyNot.c_str());
    return std::string();
  });
  probe.step("destroyEvent, destroyStream, free", [&] {
    device.destroyEvent(event);
    device.destroyStream(stream);
    device.destroyStream(other);
    device.free(a);
    device.free(b);
    device.free(host);
    return std::string();
  });
  return !probe.failed();
}

}  // namespace

int printDeviceProbe() {
  Device* device = device::current();
  if (!device) {
    std::printf("device: none: %s\n", device::unavailableReason().c_str());
    return 1;
  }
  const int version = device->driverVersion();
  std::printf("device: %s, %d devices", device->name(), device->count());
  if (version > 0) std::printf(", driver CUDA %d.%d", version / 1000, version % 1000 / 10);
  std::printf("\n");
  for (int d = 0; d < device->count(); ++d) printProperties(*device, d);
  // Every device's calls where there are a few (a GPU machine); the
  // emulated device's eight are alike, so its first stands for them.
  const int probed = std::string(device->name()) == "emulated" ? 1 : device->count();
  for (int d = 0; d < probed; ++d)
    if (!probeDevice(*device, d)) {
      std::printf("device probe: FAILED on device %d\n", d);
      return 1;
    }
  std::printf("device probe: every seam call passed on %d device%s\n", probed,
              probed == 1 ? "" : "s");
  return 0;
}

}  // namespace braid::tools
