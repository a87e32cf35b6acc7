#include "device/emulated/emulated_device.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu_relax.h"
#include "core/errors.h"
#include "core/knobs.h"
#include "device/cuda/element_ops.h"
#include "reduce/reduce.h"

namespace braid::device::emulated {
namespace {

// ---- Waiting on a word of (possibly shared) memory.

uint32_t load(const uint32_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

void storeAndWake(uint32_t* word, uint32_t value) {
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
  // Not FUTEX_PRIVATE: the waiter may be another process mapping the word.
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Raises `word` to `value` (cyclically: a smaller value leaves it) and
// wakes the waiters: an event's recordings may run out of order.
void raiseAndWake(uint32_t* word, uint32_t value) {
  uint32_t seen = load(word);
  while (
      !passes(seen, value, Compare::GreaterOrEqual) &&
      !__atomic_compare_exchange_n(word, &seen, value, false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// How long one futex sleep lasts: a waiter whose wake-up was lost (it
// cannot be, but a wait never relies on that) looks again this often.
constexpr long kWaitSliceNs = 5'000'000;

// Returns once passes(*word, value, compare). Like a GPU's wait, it never
// gives up: whoever waits for a peer must see the wait released.
void waitFor(const uint32_t* word, uint32_t value, Compare compare) {
  for (int spin = 0; spin < 128; ++spin) {
    if (passes(load(word), value, compare)) return;
    cpuRelax();
  }
  const timespec slice{0, kWaitSliceNs};
  for (;;) {
    const uint32_t seen = load(word);
    if (passes(seen, value, compare)) return;
    ::syscall(SYS_futex, word, FUTEX_WAIT, seen, &slice, nullptr, 0);
  }
}

// Returns once passes(*word, value, compare) or *abort is not 0. The
// abort word is written by the host without a wake-up for `word`, so the
// sleeps are short.
void waitForOrAbort(const uint32_t* word, uint32_t value, Compare compare, const uint32_t* abort) {
  const timespec slice{0, 1'000'000};
  for (;;) {
    const uint32_t seen = load(word);
    if (passes(seen, value, compare) || load(abort) != 0) return;
    ::syscall(SYS_futex, word, FUTEX_WAIT, seen, &slice, nullptr, 0);
  }
}

// ---- Streams and events.

// An in-order queue of tasks run by one worker thread. Destroying a stream
// (retire) returns at once; the work already queued still runs, as on a
// GPU, and the last task's end frees the stream.
class Stream {
 public:
  explicit Stream(int device) : device_(device), worker_([this] { run(); }) {}

  void retire() {
    worker_.detach();  // run() deletes the stream once its queue is empty
    std::lock_guard<std::mutex> lock(mutex_);
    retired_ = true;
    changed_.notify_all();  // under the lock: the stream may be gone once it is released
  }

  int device() const { return device_; }

  // Runs `task` after everything enqueued before it; while the stream is
  // captured, records it instead.
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (capture_) {
        capture_->push_back(std::move(task));
        return;
      }
      queue_.push_back(std::move(task));
      ++enqueued_;
    }
    changed_.notify_all();
  }

  // ---- Capture: the tasks enqueued in between, to be enqueued again on
  // each launch.
  using Tasks = std::vector<std::function<void()>>;
  void beginCapture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (capture_)
      throw Error(ErrorCode::InvalidUsage,
                  "braid: emulated device: beginCapture: the stream is being captured already");
    capture_ = std::make_shared<Tasks>();
  }
  std::shared_ptr<const Tasks> endCapture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!capture_)
      throw Error(ErrorCode::InvalidUsage,
                  "braid: emulated device: endCapture: the stream is not being captured");
    return std::move(capture_);
  }
  bool capturing() {
    std::lock_guard<std::mutex> lock(mutex_);
    return capture_ != nullptr;
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t target = enqueued_;
    changed_.wait(lock, [&] { return completed_ >= target; });
  }

 private:
  ~Stream() = default;  // only run() deletes a stream, after retire()

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return !queue_.empty() || retired_; });
      if (queue_.empty()) break;  // retired, and nothing left to run
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      ++completed_;
      changed_.notify_all();
    }
    lock.unlock();
    delete this;
  }

  const int device_;
  std::mutex mutex_;  // guards queue_, enqueued_, completed_, retired_
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, completed_ = 0;
  bool retired_ = false;
  std::shared_ptr<Tasks> capture_;  // while captured: what was enqueued
  std::thread worker_;              // last: starts once the rest is built
};

// An event: record() numbers a recording, the stream marks it done. Tasks
// share it, so it may be destroyed while a recording is still queued.
struct Event {
  uint32_t recorded = 0;  // the newest recording's number (atomic access)
  uint32_t done = 0;      // the newest recording that ran (futex word)
};
using EventRef = std::shared_ptr<Event>;

Stream& streamOf(StreamHandle handle) {
  if (!handle)
    throw Error(ErrorCode::InvalidArgument,
                "braid: emulated device: a null stream (the emulated device has no default "
                "stream; create one)");
  return *static_cast<Stream*>(handle);
}

EventRef& eventOf(EventHandle handle) { return *static_cast<EventRef*>(handle); }

// ---- Kernels.

// dst = fold of the n inputs, element by element, with the CUDA kernels'
// own element functions (accumulating narrow floats in fp32).
void foldInputs(const ReduceArgs& args) {
  cuda::visitReduction(args.type, args.op, [&](auto reduction) {
    using Reduction = decltype(reduction);
    using T = typename Reduction::Storage;
    T* dst = static_cast<T*>(args.dst);
    const T* srcs[kMaxReduceInputs] = {};
    for (int k = 0; k < args.inputs; ++k) srcs[k] = static_cast<const T*>(args.srcs[k]);
    T values[kMaxReduceInputs] = {};
    for (size_t i = 0; i < args.count; ++i) {
      for (int k = 0; k < args.inputs; ++k) values[k] = srcs[k][i];
      dst[i] = Reduction::fold(values, args.inputs);
    }
  });
}

// ---- The device.

// The GPUs BRAID_EMULATED_VISIBLE_DEVICES lets this process see, in its
// order ("2,0": device 0 is GPU 2), as CUDA_VISIBLE_DEVICES does; all
// kDevices where it is empty. Throws Error(InvalidArgument) naming the knob.
std::vector<int> visibleGpus() {
  const std::string text = knobText("BRAID_EMULATED_VISIBLE_DEVICES");
  std::vector<int> gpus;
  if (text.empty()) {
    for (int gpu = 0; gpu < kDevices; ++gpu) gpus.push_back(gpu);
    return gpus;
  }
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const bool digit = item.size() == 1 && item[0] >= '0' && item[0] < '0' + kDevices;
    const int gpu = digit ? item[0] - '0' : -1;
    if (gpu < 0 || std::find(gpus.begin(), gpus.end(), gpu) != gpus.end())
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: BRAID_EMULATED_VISIBLE_DEVICES is '%s': it lists GPUs 0 to %d, "
                         "each at most once, separated by commas",
                         text.c_str(), kDevices - 1));
    gpus.push_back(gpu);
    at = comma + 1;
  }
  return gpus;
}

// An emulated GPU's properties: its UUID is the same in every process.
Properties propertiesOf(int gpu, bool fdHandles) {
  Properties p;
  p.name = format("emulated GPU %d", gpu);
  const char tag[] = "braid-emulated";  // 14 bytes, then the GPU's number
  std::memcpy(p.uuid.data(), tag, sizeof tag - 1);
  p.uuid[15] = static_cast<uint8_t>(gpu);
  p.multiprocessors = 1;
  p.virtualMemory = true;
  p.fdHandles = fdHandles;
  p.dmabuf = true;
  p.rdmaWithVmm = true;
  p.unifiedAddressing = true;
  p.pageableMemoryAccess = true;  // it is host memory
  return p;
}

class EmulatedDevice final : public Device {
 public:
  // Throws Error(InvalidArgument) for a bad BRAID_EMULATED_VISIBLE_DEVICES.
  EmulatedDevice() : gpus_(visibleGpus()) {
    for (int gpu : gpus_) properties_.push_back(propertiesOf(gpu, fdHandles_));
  }

  const char* name() const override { return "emulated"; }
  int count() const override { return static_cast<int>(gpus_.size()); }
  int current() const override { return current_; }
  void setCurrent(int device) override {
    checkDevice(device, "setCurrent");
    current_ = device;
  }
  bool canAccessPeer(int device, int peer) const override {
    return device >= 0 && device < count() && peer >= 0 && peer < count() &&
           (device == peer || peerAccess_);
  }
  const Properties& properties(int device) const override {
    checkDevice(device, "properties");
    return properties_[static_cast<size_t>(device)];
  }
  int driverVersion() const override { return 0; }

  void* allocate(int device, size_t bytes) override {
    checkDevice(device, "allocate");
    return allocateOn(device, bytes);
  }

  // Host memory is made the same way; only its registered device (-1,
  // host) differs, so that the code that stages through it runs here too.
  void* allocateHost(size_t bytes) override { return allocateOn(-1, bytes); }

  void* importHost(int fd, size_t bytes) override { return importOn(fd, bytes, -1); }

  void* allocateOn(int device, size_t bytes) {
    const size_t length = pageRounded(bytes);
    const int fd = ::memfd_create("braid-emulated-device", MFD_CLOEXEC);
    if (fd < 0) failMemory("memfd_create", bytes, device, errno);
    if (::ftruncate(fd, static_cast<off_t>(length)) != 0) {
      const int err = errno;
      ::close(fd);
      failMemory("ftruncate", bytes, device, err);
    }
    void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      failMemory("mmap", bytes, device, err);
    }
    remember({static_cast<std::byte*>(base), length, fd, device});
    return base;
  }

  void free(void* base) override {
    const Allocation allocation = forget(base, "free");
    ::munmap(allocation.base, allocation.bytes);
    if (allocation.fd >= 0) ::close(allocation.fd);
  }

  int exportFd(const void* base) override {
    int fd = -1, device = -1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = allocations_.find(reinterpret_cast<uintptr_t>(base));
      if (it != allocations_.end()) {
        fd = it->second.fd;
        device = it->second.device;
      }
    }
    if (fd < 0)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: emulated device: exportFd: %p is not the start of memory from "
                         "allocate()",
                         base));
    if (!fdHandles_ && device >= 0)
      throw Error(ErrorCode::SystemError,
                  format("braid: emulated device: exportFd(%p): device %d has no POSIX-fd "
                         "handles (BRAID_EMULATED_FD_HANDLES=0): its memory cannot be mapped by "
                         "another process",
                         base, device));
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0)
      throw Error(ErrorCode::SystemError,
                  format("braid: emulated device: exportFd: dup: %s", std::strerror(errno)));
    return copy;
  }

  // Its memfd: the fake fabric maps it into peer processes, as a NIC
  // reaches a GPU's memory through its dma-buf.
  int exportDmabuf(const void* base, size_t bytes, uint64_t* offset, std::string*) override {
    size_t length = 0;  // 0: not device memory from allocate()
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = allocations_.find(reinterpret_cast<uintptr_t>(base));
      if (it != allocations_.end() && it->second.device >= 0 && it->second.fd >= 0)
        length = it->second.bytes;
    }
    if (length == 0)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: emulated device: exportDmabuf: %p is not the start of device "
                         "memory from allocate()",
                         base));
    if (bytes > length)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: emulated device: exportDmabuf: %zu bytes at %p, and the "
                         "allocation has %zu",
                         bytes, base, length));
    *offset = 0;
    return exportFd(base);
  }

  void* import(int fd, size_t bytes, int device) override {
    checkDevice(device, "import");
    return importOn(fd, bytes, device);
  }

  void* importOn(int fd, size_t bytes, int device) {
    const size_t length = pageRounded(bytes);
    void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) failMemory("import: mmap", bytes, device, errno);
    remember({static_cast<std::byte*>(base), length, -1, device});
    return base;
  }

  void unimport(void* base, size_t bytes) override {
    (void)bytes;
    const Allocation allocation = forget(base, "unimport");
    ::munmap(allocation.base, allocation.bytes);
  }

  int deviceOf(const void* pointer) override {
    if (count_.load(std::memory_order_relaxed) == 0) return -1;
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = allocations_.upper_bound(address);
    if (next == allocations_.begin()) return -1;
    const Allocation& allocation = std::prev(next)->second;
    return address - reinterpret_cast<uintptr_t>(allocation.base) < allocation.bytes
               ? allocation.device
               : -1;
  }

  StreamHandle createStream(int device) override {
    checkDevice(device, "createStream");
    return new Stream(device);
  }
  void destroyStream(StreamHandle stream) override { streamOf(stream).retire(); }
  void synchronize(StreamHandle stream) override { streamOf(stream).synchronize(); }

  EventHandle createEvent(int device) override {
    checkDevice(device, "createEvent");
    return new EventRef(std::make_shared<Event>());
  }
  bool capturing(StreamHandle stream) override { return streamOf(stream).capturing(); }
  void beginCapture(StreamHandle stream) override { streamOf(stream).beginCapture(); }
  GraphHandle endCapture(StreamHandle stream) override {
    return new std::shared_ptr<const Stream::Tasks>(streamOf(stream).endCapture());
  }
  void launchGraph(GraphHandle graph, StreamHandle handle) override {
    Stream& stream = streamOf(handle);
    for (const auto& task : **static_cast<std::shared_ptr<const Stream::Tasks>*>(graph))
      stream.enqueue(task);
  }
  void destroyGraph(GraphHandle graph) override {
    delete static_cast<std::shared_ptr<const Stream::Tasks>*>(graph);
  }
  void destroyEvent(EventHandle event) override { delete &eventOf(event); }
  void record(EventHandle handle, StreamHandle stream) override {
    refuseCaptured(stream, "record");
    EventRef event = eventOf(handle);
    const uint32_t number = __atomic_add_fetch(&event->recorded, 1, __ATOMIC_ACQ_REL);
    streamOf(stream).enqueue([event, number] { raiseAndWake(&event->done, number); });
  }
  void streamWait(StreamHandle handle, EventHandle eventHandle) override {
    refuseCaptured(handle, "streamWait");
    Stream& stream = streamOf(handle);
    EventRef event = eventOf(eventHandle);
    const uint32_t number = __atomic_load_n(&event->recorded, __ATOMIC_ACQUIRE);
    stream.enqueue([event, number] { waitFor(&event->done, number, Compare::GreaterOrEqual); });
  }
  bool query(EventHandle handle) override {
    const Event& event = *eventOf(handle);
    return passes(load(&event.done), __atomic_load_n(&event.recorded, __ATOMIC_ACQUIRE),
                  Compare::GreaterOrEqual);
  }

  void copy(StreamHandle stream, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    streamOf(stream).enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
  }

  void reduce(StreamHandle stream, const ReduceArgs& args) override {
    checkReduce(args);
    if (args.count == 0) return;
    checkReach(args.dst);
    for (int i = 0; i < args.inputs; ++i) checkReach(args.srcs[i]);
    streamOf(stream).enqueue([args] { reduceNow(args); });
  }

  // A GPU's kernel can touch device memory and page-locked host memory
  // (allocateHost, importHost); any other host memory ends a CUDA context
  // with an illegal address. Refused here as the CUDA device refuses it, so
  // that a caller that would pass it fails on this machine too.
  void checkReach(const void* pointer) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto next = allocations_.upper_bound(address);
      if (next != allocations_.begin()) {
        const Allocation& allocation = std::prev(next)->second;
        if (address - reinterpret_cast<uintptr_t>(allocation.base) < allocation.bytes) return;
      }
    }
    throw Error(ErrorCode::InvalidArgument,
                format("braid: emulated device: reduce: %p is host memory that is not "
                       "page-locked (allocateHost, importHost), which a kernel cannot touch: "
                       "register it or copy it into device memory",
                       pointer));
  }

  void flagOps(StreamHandle handle, const FlagOp* ops, size_t count) override {
    if (count == 0) return;
    Stream& stream = streamOf(handle);
    std::vector<FlagOp> batch(ops, ops + count);
    stream.enqueue([batch = std::move(batch)] {
      for (const FlagOp& op : batch) {
        const uint32_t value = op.base ? load(op.base) + op.value : op.value;
        switch (op.kind) {
          case FlagOp::Kind::Write:
            storeAndWake(op.flag, value);
            break;
          case FlagOp::Kind::Wait:
            if (op.abort)
              waitForOrAbort(op.flag, value, op.compare, op.abort);
            else
              waitFor(op.flag, value, op.compare);
            break;
          case FlagOp::Kind::Add:
            storeAndWake(op.flag, load(op.flag) + op.value);
            break;
        }
      }
    });
  }

  void writeFlagNow(uint32_t* flag, uint32_t value) override { storeAndWake(flag, value); }
  uint32_t readFlagNow(const uint32_t* flag) override { return load(flag); }
  void copyNow(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }

 private:
  struct Allocation {
    std::byte* base;
    size_t bytes;  // mapped length
    int fd;        // the memfd, or -1 for an import
    int device;
  };

  static size_t pageRounded(size_t bytes) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  }

  // Events are not captured: a graph of the emulated device replays its
  // own stream's work only.
  static void refuseCaptured(StreamHandle stream, const char* what) {
    if (streamOf(stream).capturing())
      throw Error(ErrorCode::InvalidUsage,
                  format("braid: emulated device: %s on a stream being captured: the emulated "
                         "device captures no events",
                         what));
  }

  void checkDevice(int device, const char* what) const {
    if (device < 0 || device >= count())
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: emulated device: %s: device %d does not exist (devices 0 to %d)",
                         what, device, count() - 1));
  }

  static void checkReduce(const ReduceArgs& args) {
    if (args.inputs < 1 || args.inputs > kMaxReduceInputs)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: emulated device: reduce of %d inputs (1 to %d)", args.inputs,
                         kMaxReduceInputs));
    if (!isValid(args.type) || !isValid(args.op))
      throw Error(ErrorCode::InvalidArgument, "braid: emulated device: reduce: bad type or op");
  }

  // Two inputs: braid's host kernel. More: the device's fold (fp32
  // accumulation for narrow floats, one rounding), which for two inputs
  // gives the same bits.
  static void reduceNow(const ReduceArgs& args) {
    if (args.inputs == 1) {
      if (args.dst != args.srcs[0])
        std::memmove(args.dst, args.srcs[0], args.count * dataTypeSize(args.type));
    } else if (args.inputs == 2) {
      reduce::kernelFor(args.type, args.op)(args.dst, args.srcs[0], args.srcs[1], args.count);
    } else {
      foldInputs(args);
    }
    if (args.finalizeDivisor >= 1)
      reduce::finalize(args.dst, args.count, args.type, args.op, args.finalizeDivisor);
  }

  [[noreturn]] static void failMemory(const char* call, size_t bytes, int device, int err) {
    throw Error(ErrorCode::SystemError,
                format("braid: emulated device: %zu bytes on device %d: %s: %s", bytes, device,
                       call, std::strerror(err)));
  }

  void remember(const Allocation& allocation) {
    std::lock_guard<std::mutex> lock(mutex_);
    allocations_[reinterpret_cast<uintptr_t>(allocation.base)] = allocation;
    count_.store(allocations_.size(), std::memory_order_relaxed);
  }

  Allocation forget(void* base, const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(base));
    if (it == allocations_.end())
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: emulated device: %s: %p is not the start of emulated device "
                         "memory",
                         what, base));
    const Allocation allocation = it->second;
    allocations_.erase(it);
    count_.store(allocations_.size(), std::memory_order_relaxed);
    return allocation;
  }

  static thread_local int current_;
  // BRAID_EMULATED_PEER_ACCESS=0: devices do not reach each other, as GPUs
  // on different PCIe roots without NVLink.
  const bool peerAccess_ = knobText("BRAID_EMULATED_PEER_ACCESS") != "0";
  // BRAID_EMULATED_FD_HANDLES=0: exportFd() refuses device memory, as on a
  // GPU without cuMem POSIX-fd handles (some virtual machines and vGPUs).
  const bool fdHandles_ = knobText("BRAID_EMULATED_FD_HANDLES") != "0";
  const std::vector<int> gpus_;         // the GPU each device of this process is
  std::vector<Properties> properties_;  // [device]
  std::mutex mutex_;                    // guards allocations_
  std::map<uintptr_t, Allocation> allocations_;
  std::atomic<size_t> count_{0};  // allocations_.size(), read without the lock
};

thread_local int EmulatedDevice::current_ = 0;

}  // namespace

std::unique_ptr<Device> create() { return std::make_unique<EmulatedDevice>(); }

}  // namespace braid::device::emulated
