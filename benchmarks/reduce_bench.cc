// braid-bench-reduce: Google Benchmark microbenchmarks of the host reduction
// kernels (src/reduce), one core.
//
//   reduce/<type>/<op>/<isa>/<size>   dst = a op b over three buffers of
//                                     <size> bytes each, for every ISA level
//                                     this CPU supports (dispatch.h)
//   memcpy/<size>                     memcpy of one <size> buffer into another
//
// Sizes: 256KiB per buffer keeps a reduction's three buffers (768 KiB) in a
// 1 MiB L2; 64MiB per buffer goes to memory. memcpy also runs at sizes in
// between, as the single-core copy bandwidth for reference.
//
// Units: bytes processed count every byte read and written, so a reduction
// moves 3 x size per call (two reads, one write) and memcpy 2 x size (one
// read, one write). The GB/s counter is that in 1e9 bytes per second
// (Google Benchmark's own bytes_per_second column uses 2^30). Avg runs the
// Sum kernel (finalize() divides) and is not listed.
//
//   braid-bench-reduce --benchmark_min_time=0.2 --benchmark_filter='float32/sum|memcpy'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "reduce/dispatch.h"
#include "reduce/reduce.h"

namespace braid::reduce {
namespace {

constexpr size_t kL2Bytes = size_t{256} << 10;
constexpr size_t kLargeBytes = size_t{64} << 20;

struct TypeInfo {
  DataType type;
  const char* name;
  size_t size;
};

constexpr TypeInfo kTypes[] = {
    {DataType::Int8, "int8", 1},          {DataType::Uint8, "uint8", 1},
    {DataType::Int32, "int32", 4},        {DataType::Uint32, "uint32", 4},
    {DataType::Int64, "int64", 8},        {DataType::Uint64, "uint64", 8},
    {DataType::Float16, "float16", 2},    {DataType::Float32, "float32", 4},
    {DataType::Float64, "float64", 8},    {DataType::BFloat16, "bfloat16", 2},
    {DataType::Float8E4M3, "fp8e4m3", 1}, {DataType::Float8E5M2, "fp8e5m2", 1},
};

struct OpInfo {
  ReduceOp op;
  const char* name;
};

constexpr OpInfo kOps[] = {{ReduceOp::Sum, "sum"},
                           {ReduceOp::Prod, "prod"},
                           {ReduceOp::Max, "max"},
                           {ReduceOp::Min, "min"}};

// Three buffers of kLargeBytes, 4 KiB aligned and touched once, shared by
// every benchmark (so none times page faults).
struct Buffers {
  unsigned char* dst;
  unsigned char* a;
  unsigned char* b;
};

unsigned char* allocateTouched(size_t bytes) {
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) std::abort();
  std::memset(p, 0, bytes);
  return p;
}

const Buffers& buffers() {
  static const Buffers b = {allocateTouched(kLargeBytes), allocateTouched(kLargeBytes),
                            allocateTouched(kLargeBytes)};
  return b;
}

// Fills both operand buffers (all kLargeBytes; smaller runs use the start)
// with ordinary values of the type, so that no float result is NaN,
// infinite or subnormal: in fp32, uniform in [0.5, 2) with random signs,
// narrowed for the narrow types; integers are random bits. Only when the
// type differs from the last call's: Google Benchmark calls a benchmark
// function several times.
void fillOperands(const TypeInfo& t) {
  static DataType filled = static_cast<DataType>(-1);
  if (filled == t.type) return;
  filled = t.type;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
  const size_t count = kLargeBytes / t.size;
  for (unsigned char* buffer : {buffers().a, buffers().b}) {
    for (size_t i = 0; i < count; ++i) {
      const float f = (rng() & 1) != 0 ? magnitude(rng) : -magnitude(rng);
      unsigned char* p = buffer + i * t.size;
      uint64_t bits = rng();
      switch (t.type) {
        case DataType::Float16:
          bits = floatToHalf(f);
          break;
        case DataType::BFloat16:
          bits = floatToBf16(f);
          break;
        case DataType::Float8E4M3:
          bits = floatToFp8e4m3(f);
          break;
        case DataType::Float8E5M2:
          bits = floatToFp8e5m2(f);
          break;
        case DataType::Float32:
          std::memcpy(&bits, &f, sizeof f);
          break;
        case DataType::Float64: {
          const double d = f;
          std::memcpy(&bits, &d, sizeof d);
          break;
        }
        default:
          break;
      }
      std::memcpy(p, &bits, t.size);
    }
  }
}

std::string sizeName(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + "MiB"
                                    : std::to_string(bytes >> 10) + "KiB";
}

void setThroughput(benchmark::State& state, size_t bytesPerIteration) {
  const double bytes = static_cast<double>(bytesPerIteration) * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

void reduceBenchmark(benchmark::State& state, TypeInfo t, Kernel kernel, size_t bytes) {
  fillOperands(t);
  const Buffers& buf = buffers();
  const size_t count = bytes / t.size;
  for (auto _ : state) {
    kernel(buf.dst, buf.a, buf.b, count);
    benchmark::ClobberMemory();
  }
  setThroughput(state, 3 * count * t.size);
}

void memcpyBenchmark(benchmark::State& state, size_t bytes) {
  const Buffers& buf = buffers();
  for (auto _ : state) {
    std::memcpy(buf.dst, buf.a, bytes);
    benchmark::ClobberMemory();
  }
  setThroughput(state, 2 * bytes);
}

void registerAll() {
  for (size_t bytes : {size_t{32} << 10, kL2Bytes, size_t{1} << 20, size_t{4} << 20,
                       size_t{16} << 20, kLargeBytes}) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(), memcpyBenchmark, bytes);
  }
  for (const TypeInfo& t : kTypes) {
    for (const OpInfo& o : kOps) {
      for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
        const Kernel kernel = kernelFor(t.type, o.op, isa);
        if (kernel == nullptr) continue;  // not supported here
        for (size_t bytes : {kL2Bytes, kLargeBytes}) {
          const std::string name = std::string("reduce/") + t.name + "/" + o.name + "/" +
                                   isaName(isa) + "/" + sizeName(bytes);
          benchmark::RegisterBenchmark(name.c_str(), reduceBenchmark, t, kernel, bytes);
        }
      }
    }
  }
}

}  // namespace
}  // namespace braid::reduce

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  braid::reduce::registerAll();
  benchmark::AddCustomContext("braid_best_isa", braid::reduce::isaName(braid::reduce::bestIsa()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
