#include "device/device.h"

#include <atomic>
#include <memory>
#include <mutex>

#include "braid/error.h"
#include "core/errors.h"
#include "core/knobs.h"
#include "device/emulated/emulated_device.h"
#if BRAID_HAVE_CUDA
#include "device/cuda/cuda_device.h"
#endif

namespace braid::device {
namespace {

// The process's choice, made once. Never destroyed: streams may run at exit.
struct Choice {
  std::mutex mutex;
  bool made = false;
  std::string requested;  // select()'s name, else BRAID_DEVICE's
  std::unique_ptr<Device> device;
  std::string reason;  // why there is none
  std::atomic<Device*> ready{nullptr};
  std::atomic<bool> decided{false};
};

Choice& choice() {
  static Choice* instance = new Choice;
  return *instance;
}

void decide(Choice& c) {
  if (c.made) return;
  c.made = true;
  std::string name = c.requested.empty() ? knobText("BRAID_DEVICE") : c.requested;
  if (name == "none") {
    c.reason = "BRAID_DEVICE=none turns device memory off";
  } else if (name == "emulated") {
    try {
      c.device = emulated::create();
    } catch (const Error& error) {
      c.reason = error.what();
    }
  } else if (name == "cuda" || name == "auto") {
#if BRAID_HAVE_CUDA
    std::string whyNot;
    c.device = cuda::create(&whyNot);
    if (!c.device) c.reason = "CUDA cannot be used here: " + whyNot;
#else
    c.reason = "this braid was built without CUDA (BRAID_CUDA=OFF, or no toolkit at build time)";
#endif
  } else {
    c.reason = format("BRAID_DEVICE is '%s', not auto, cuda, emulated or none", name.c_str());
  }
  c.ready.store(c.device.get(), std::memory_order_release);
  c.decided.store(true, std::memory_order_release);
}

}  // namespace

Device* current() {
  Choice& c = choice();
  if (c.decided.load(std::memory_order_acquire)) return c.ready.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(c.mutex);
  decide(c);
  return c.device.get();
}

std::string unavailableReason() {
  Choice& c = choice();
  std::lock_guard<std::mutex> lock(c.mutex);
  decide(c);
  return c.reason;
}

Device& require(const char* what) {
  if (Device* device = current()) return *device;
  throw Error(ErrorCode::InvalidUsage, format("braid: %s needs a device, and there is none: %s",
                                              what, unavailableReason().c_str()));
}

std::string uuidText(const std::array<uint8_t, 16>& uuid) {
  std::string text = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += format("%02x", uuid[i]);
  }
  return text;
}

void select(const std::string& name) {
  Choice& c = choice();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.made) {
    const char* chosen = c.device ? c.device->name() : "none";
    if (name == chosen) return;
    throw Error(ErrorCode::InvalidUsage,
                format("braid: device::select('%s'): this process already uses device '%s'",
                       name.c_str(), chosen));
  }
  c.requested = name;
}

}  // namespace braid::device
