// braid-bench-device-kernels: Google Benchmark microbenchmarks of the device
// seam's stream-ordered kernels (src/device/device.h) on this process's
// device, which BRAID_DEVICE picks (cuda on a GPU machine; emulated, the
// device made of host memory, anywhere).
//
//   copy/<size>                  Device::copy of one device buffer into another:
//                                the baseline
//   reduce2/<type>/sum/<size>    Device::reduce of 2 inputs into a third buffer,
//                                for float32, bfloat16 and float16
//
// Each iteration enqueues --ops_per_sync operations on one stream, then
// synchronizes it; times are wall clock (UseRealTime), after one untimed
// batch. Sizes are per buffer: --min_bytes, then times --step_factor, up to
// --max_bytes (which is always included). Defaults: 64M and 1G, factor 16;
// on the emulated device, whose memory is this host's, 64M and 256M (three
// buffers of the largest size, under 1 GiB in all).
//
// Units: bytes processed count every byte read and written, so a copy moves
// 2 x size per operation (one read, one write) and a 2-input reduction
// 3 x size (two reads, one write); the GB/s counter is that in 1e9 bytes
// per second. At one size, reduce2 GB/s over copy GB/s is the fraction of
// the copy kernel's bandwidth the reduction kernel reaches.
//
//   BRAID_DEVICE=cuda braid-bench-device-kernels --min_bytes=1G
//   BRAID_DEVICE=emulated braid-bench-device-kernels --max_bytes=16M
// With no device, every benchmark is skipped with the reason.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_cli.h"
#include "braid/types.h"
#include "device/device.h"
#include "reduce/reduce.h"

namespace braid::device {
namespace {

struct Settings {
  size_t minBytes = 0;  // 0: 64M, or --max_bytes when that is smaller
  size_t maxBytes = 0;  // 0: the device's default (see defaultMaxBytes), or --min_bytes
  size_t stepFactor = 16;
  int opsPerSync = 8;
};

size_t defaultMaxBytes(const Device* device) {
  bool emulated = device != nullptr && std::strcmp(device->name(), "emulated") == 0;
  return emulated ? size_t{256} << 20 : size_t{1} << 30;
}

// Takes this tool's own flags (--name=value) out of argv; throws
// bench::UsageError.
Settings parseSettings(int* argc, char** argv) {
  Settings settings;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (name == "--min_bytes") {
      settings.minBytes = bench::bytesValue(name, value);
    } else if (name == "--max_bytes") {
      settings.maxBytes = bench::bytesValue(name, value);
    } else if (name == "--step_factor") {
      settings.stepFactor = static_cast<size_t>(bench::intValue(name, value, 2, 1 << 20));
    } else if (name == "--ops_per_sync") {
      settings.opsPerSync = static_cast<int>(bench::intValue(name, value, 1, 1 << 20));
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  return settings;
}

struct TypeInfo {
  DataType type;
  const char* name;
};

constexpr TypeInfo kTypes[] = {{DataType::Float32, "float32"},
                               {DataType::BFloat16, "bfloat16"},
                               {DataType::Float16, "float16"}};

// Three device buffers of the largest size, and the one stream every
// operation runs on, made at the first benchmark that runs and kept to the
// end of the process (so no benchmark times an allocation or a page fault).
class Bench {
 public:
  // The process's one Bench; null device (and why()) when there is none.
  static Bench& get(size_t bytes) {
    static Bench* bench = new Bench(bytes);
    return *bench;
  }

  // Why no benchmark can run here ("" when they can).
  const std::string& why() const { return why_; }
  Device& device() const { return *device_; }
  StreamHandle stream() const { return stream_; }
  void* dst() const { return dst_; }
  void* a() const { return a_; }
  void* b() const { return b_; }

  // Fills both reduce inputs with ordinary values of `type` (so that no
  // result is NaN, infinite or subnormal): uniform in [0.5, 2) with random
  // signs, narrowed for the narrow types. Only when the type differs from
  // the last call's.
  void fill(DataType type) {
    if (filled_ == static_cast<int>(type)) return;
    filled_ = static_cast<int>(type);
    const size_t element = dataTypeSize(type);
    std::vector<unsigned char> block(std::min<size_t>(bytes_, size_t{16} << 20));
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
    for (size_t i = 0; i + element <= block.size(); i += element) {
      const float f = (rng() & 1) != 0 ? magnitude(rng) : -magnitude(rng);
      if (type == DataType::Float32) {
        std::memcpy(&block[i], &f, sizeof f);
      } else {
        const uint16_t bits =
            type == DataType::BFloat16 ? reduce::floatToBf16(f) : reduce::floatToHalf(f);
        std::memcpy(&block[i], &bits, sizeof bits);
      }
    }
    for (void* buffer : {a_, b_}) {
      for (size_t at = 0; at < bytes_; at += block.size()) {
        device_->copyNow(static_cast<unsigned char*>(buffer) + at, block.data(),
                         std::min(block.size(), bytes_ - at));
      }
    }
  }

 private:
  explicit Bench(size_t bytes) : bytes_(bytes) {
    device_ = current();
    if (!device_) {
      why_ = "no device: " + unavailableReason();
      return;
    }
    try {
      const int index = device_->current();
      stream_ = device_->createStream(index);
      dst_ = device_->allocate(index, bytes);
      a_ = device_->allocate(index, bytes);
      b_ = device_->allocate(index, bytes);
    } catch (const std::exception& e) {
      why_ = e.what();
    }
  }

  size_t bytes_;
  Device* device_ = nullptr;
  std::string why_;
  StreamHandle stream_ = nullptr;
  void* dst_ = nullptr;
  void* a_ = nullptr;
  void* b_ = nullptr;
  int filled_ = -1;
};

void setThroughput(benchmark::State& state, size_t bytesPerOp, int opsPerSync) {
  const double bytes = static_cast<double>(bytesPerOp) * opsPerSync * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

// Runs `enqueue` opsPerSync times then synchronizes, once untimed and then
// once per iteration.
template <typename Enqueue>
void timeBatches(benchmark::State& state, const Bench& bench, int opsPerSync, Enqueue enqueue) {
  auto batch = [&] {
    for (int i = 0; i < opsPerSync; ++i) enqueue();
    bench.device().synchronize(bench.stream());
  };
  batch();
  for (auto _ : state) batch();
}

void copyBenchmark(benchmark::State& state, size_t bytes, size_t allocated, int opsPerSync) {
  Bench& bench = Bench::get(allocated);
  if (!bench.why().empty()) {
    state.SkipWithError(bench.why().c_str());
    return;
  }
  try {
    timeBatches(state, bench, opsPerSync,
                [&] { bench.device().copy(bench.stream(), bench.dst(), bench.a(), bytes); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  setThroughput(state, 2 * bytes, opsPerSync);
}

void reduceBenchmark(benchmark::State& state, DataType type, size_t bytes, size_t allocated,
                     int opsPerSync) {
  Bench& bench = Bench::get(allocated);
  if (!bench.why().empty()) {
    state.SkipWithError(bench.why().c_str());
    return;
  }
  ReduceArgs args;
  args.dst = bench.dst();
  args.srcs[0] = bench.a();
  args.srcs[1] = bench.b();
  args.inputs = 2;
  args.count = bytes / dataTypeSize(type);
  args.type = type;
  args.op = ReduceOp::Sum;
  try {
    bench.fill(type);
    timeBatches(state, bench, opsPerSync, [&] { bench.device().reduce(bench.stream(), args); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  setThroughput(state, 3 * args.count * dataTypeSize(type), opsPerSync);
}

std::string sizeName(size_t bytes) {
  if (bytes % (size_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "GiB";
  if (bytes % (size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  if (bytes % (size_t{1} << 10) == 0) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes) + "B";
}

void registerAll(const Settings& settings) {
  std::vector<size_t> sizes =
      bench::sizeSteps(settings.minBytes, settings.maxBytes, settings.stepFactor, 0);
  if (sizes.back() != settings.maxBytes) sizes.push_back(settings.maxBytes);
  const size_t allocated = settings.maxBytes;
  const int k = settings.opsPerSync;
  for (size_t bytes : sizes) {
    benchmark::RegisterBenchmark(("copy/" + sizeName(bytes)).c_str(), copyBenchmark, bytes,
                                 allocated, k)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    for (const TypeInfo& t : kTypes) {
      const std::string name = std::string("reduce2/") + t.name + "/sum/" + sizeName(bytes);
      benchmark::RegisterBenchmark(name.c_str(), reduceBenchmark, t.type, bytes, allocated, k)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace braid::device

int main(int argc, char** argv) {
  using namespace braid::device;
  Settings settings;
  try {
    settings = parseSettings(&argc, argv);
    if (settings.maxBytes == 0)
      settings.maxBytes = std::max(settings.minBytes, defaultMaxBytes(current()));
    if (settings.minBytes == 0) settings.minBytes = std::min(size_t{64} << 20, settings.maxBytes);
    if (settings.minBytes > settings.maxBytes)
      throw braid::bench::UsageError("--min_bytes is larger than --max_bytes");
  } catch (const braid::bench::UsageError& e) {
    std::fprintf(stderr, "braid-bench-device-kernels: %s\n", e.what());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  registerAll(settings);
  Device* device = current();
  benchmark::AddCustomContext("braid_device", device ? device->name() : "none");
  if (!device) benchmark::AddCustomContext("braid_device_missing", unavailableReason());
  benchmark::AddCustomContext("braid_ops_per_sync", std::to_string(settings.opsPerSync));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
