// peer-nccl-device: the NCCL API on device buffers, timed the way
// braid-perf times (benchmarks/braid_perf.cc), for one side-by-side table
// of braid and NVIDIA's NCCL (benchmarks/gpu_compare.sh). Built against
// NCCL's own nccl.h and linked with libnccl.so.2: braid's from its build,
// or NVIDIA's when LD_LIBRARY_PATH names the toolkit's first, so both
// libraries run the same binary.
//
// NCCL's single-process model, as nccl-tests' -g: one process drives -g N
// ranks (ncclCommInitAll), rank r on device r % D (-D, default N: a device
// per rank). Each iteration issues the collective on every rank's stream
// inside one ncclGroupStart/ncclGroupEnd; the time of a size is the mean
// over -n iterations after -w warm-up ones, from the first issue to the
// last stream's end. Then one more call on check data, whose wrong
// elements are counted (any makes the exit status 1).
//   peer-nccl-device COLLECTIVE [-g N] [-D D] [-b MIN] [-e MAX] [-f FACTOR]
//                    [-n ITERS] [-w WARMUP] [-d float32|bfloat16]
// COLLECTIVE: allreduce, allgather, reducescatter, broadcast, reduce.
// Columns: braid-perf's (size count type redop root time algbw busbw
// #wrong), out of place only; bytes as braid-perf counts them.
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "benchmarks/bench_cli.h"
#include "benchmarks/peers/nccl_device_calls.h"

namespace {

constexpr const char* kName = "peer-nccl-device";

[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "%s: %s\n", kName, what.c_str());
  exit(1);
}

void check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess)
    die(std::string(call) + ": " + ncclGetErrorString(result) + ": " + ncclGetLastError(nullptr));
}
#define NCCL(call) check((call), #call)

enum class Coll { AllReduce, AllGather, ReduceScatter, Broadcast, Reduce };

struct Options {
  Coll coll = Coll::AllReduce;
  const char* collName = "allreduce";
  int ranks = 1;
  int devices = 0;  // 0: one per rank
  size_t minBytes = 8, maxBytes = size_t{256} << 20, factor = 2;
  int iters = 20, warmup = 5;
  bool bf16 = false;
};

// bytes as braid-perf counts them: the whole gathered buffer for
// all-gather and reduce-scatter, the buffer otherwise; busbw's factor.
double busFactor(Coll coll, int n) {
  if (coll == Coll::AllReduce) return 2.0 * (n - 1) / n;
  if (coll == Coll::AllGather || coll == Coll::ReduceScatter) return static_cast<double>(n - 1) / n;
  return 1.0;
}

Options parse(int argc, char** argv) {
  using braid::bench::bytesValue;
  using braid::bench::intValue;
  using braid::bench::UsageError;
  Options o;
  if (argc < 2) throw UsageError("the first argument names the collective");
  const std::string name = argv[1];
  const std::pair<const char*, Coll> known[] = {{"allreduce", Coll::AllReduce},
                                                {"allgather", Coll::AllGather},
                                                {"reducescatter", Coll::ReduceScatter},
                                                {"broadcast", Coll::Broadcast},
                                                {"reduce", Coll::Reduce}};
  bool found = false;
  for (const auto& [text, coll] : known)
    if (name == text) o.coll = coll, o.collName = text, found = true;
  if (!found) throw UsageError("'" + name + "' is not a collective this program times");
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    if (i + 1 >= argc) throw UsageError(option + " needs a value");
    const std::string value = argv[++i];
    if (option == "-g")
      o.ranks = static_cast<int>(intValue(option, value, 1, 64));
    else if (option == "-D")
      o.devices = static_cast<int>(intValue(option, value, 1, 64));
    else if (option == "-b")
      o.minBytes = bytesValue(option, value);
    else if (option == "-e")
      o.maxBytes = bytesValue(option, value);
    else if (option == "-f")
      o.factor = static_cast<size_t>(intValue(option, value, 2, 1024));
    else if (option == "-n")
      o.iters = static_cast<int>(intValue(option, value, 1, 1000000));
    else if (option == "-w")
      o.warmup = static_cast<int>(intValue(option, value, 0, 1000000));
    else if (option == "-d" && (value == "float32" || value == "bfloat16"))
      o.bf16 = value[0] == 'b';
    else
      throw UsageError(option + " " + value + ": not an option of this program");
  }
  if (o.devices == 0) o.devices = o.ranks;
  return o;
}

float fromBf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  memcpy(&value, &wide, sizeof(value));
  return value;
}
uint16_t toBf16(float value) {  // exact for the small integers used here
  uint32_t wide;
  memcpy(&wide, &value, sizeof(wide));
  return static_cast<uint16_t>(wide >> 16);
}

struct Rank {
  ncclComm_t comm = nullptr;
  void* stream = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const braid::bench::UsageError& error) {
    fprintf(stderr,
            "%s: %s\nusage: %s COLLECTIVE [-g N] [-D D] [-b MIN] [-e MAX] [-f FACTOR] "
            "[-n ITERS] [-w WARMUP] [-d float32|bfloat16]\n",
            kName, error.what(), kName);
    return 2;
  }
  braid::peers::NcclDeviceCalls device(kName);
  const int n = o.ranks;
  const size_t elem = o.bf16 ? 2 : 4;
  const ncclDataType_t type = o.bf16 ? ncclBfloat16 : ncclFloat32;
  const int root = 0;
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = r % o.devices;
  std::vector<ncclComm_t> comms(n);
  NCCL(ncclCommInitAll(comms.data(), n, devices.data()));
  int version = 0;
  NCCL(ncclGetVersion(&version));

  // Per rank: send holds one rank's part, recv n parts (enough for every
  // collective at the largest size).
  const size_t maxCount = o.maxBytes / elem;
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].comm = comms[r];
    braid::peers::NcclDeviceCalls::check(device.setCurrent(devices[r]), kName,
                                         "setting the device");
    braid::peers::NcclDeviceCalls::check(device.streamCreate(&ranks[r].stream), kName,
                                         "making a stream");
    NCCL(ncclMemAlloc(&ranks[r].send, std::max<size_t>(maxCount, 1) * elem));
    NCCL(ncclMemAlloc(&ranks[r].recv, std::max<size_t>(maxCount, 1) * elem * n));
  }
  auto synchronizeAll = [&] {
    for (Rank& rank : ranks)
      braid::peers::NcclDeviceCalls::check(device.streamSynchronize(rank.stream), kName,
                                           "synchronizing");
  };
  // count: elements of the op's count argument (per rank for all-gather
  // and reduce-scatter, as NCCL's API takes them).
  auto issueAll = [&](size_t count) {
    NCCL(ncclGroupStart());
    for (Rank& rank : ranks) {
      auto stream = static_cast<cudaStream_t>(rank.stream);
      switch (o.coll) {
        case Coll::AllReduce:
          NCCL(ncclAllReduce(rank.send, rank.recv, count, type, ncclSum, rank.comm, stream));
          break;
        case Coll::AllGather:
          NCCL(ncclAllGather(rank.send, rank.recv, count, type, rank.comm, stream));
          break;
        case Coll::ReduceScatter:
          NCCL(ncclReduceScatter(rank.recv, rank.send, count, type, ncclSum, rank.comm, stream));
          break;
        case Coll::Broadcast:
          NCCL(ncclBroadcast(rank.send, rank.recv, count, type, root, rank.comm, stream));
          break;
        case Coll::Reduce:
          NCCL(ncclReduce(rank.send, rank.recv, count, type, ncclSum, root, rank.comm, stream));
          break;
      }
    }
    NCCL(ncclGroupEnd());
  };

  printf("# %s: %s on %s's NCCL %d, %d ranks in one process on %d devices\n", kName, o.collName,
         device.braid() ? "braid" : "NVIDIA", version, n, o.devices);
  printf("# %10s %12s %9s %7s %7s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong");
  printf("# %10s %12s %9s %7s %7s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "");
  long long wrongTotal = 0;
  for (size_t bytes : braid::bench::sizeSteps(o.minBytes, o.maxBytes, o.factor, 0)) {
    // braid-perf's size: the whole buffer; per-rank parts for the
    // gathering and scattering collectives.
    const bool parts = o.coll == Coll::AllGather || o.coll == Coll::ReduceScatter;
    const size_t total = bytes / elem / (parts ? n : 1) * (parts ? n : 1);
    const size_t count = parts ? total / n : total;
    if (count == 0) continue;
    const size_t sendCount = o.coll == Coll::ReduceScatter ? total : count;

    // Check data: rank r's element i is (r + 1) * (i % 7 + 1), small
    // integers every type holds exactly, as are their sums.
    for (int r = 0; r < n; ++r) {
      std::vector<float> values(sendCount);
      for (size_t i = 0; i < sendCount; ++i) values[i] = static_cast<float>((r + 1) * (i % 7 + 1));
      std::vector<uint16_t> narrow(o.bf16 ? sendCount : 0);
      for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = toBf16(values[i]);
      void* from = o.bf16 ? static_cast<void*>(narrow.data()) : static_cast<void*>(values.data());
      void* into = o.coll == Coll::ReduceScatter ? ranks[r].recv : ranks[r].send;
      braid::peers::NcclDeviceCalls::check(device.copy(into, from, sendCount * elem), kName,
                                           "copying in");
    }
    issueAll(count);
    synchronizeAll();
    long long wrong = 0;
    const double sum = n * (n + 1) / 2.0;
    for (int r = 0; r < n; ++r) {
      const size_t outCount = o.coll == Coll::AllGather ? total : count;
      if (o.coll == Coll::Reduce && r != root) continue;
      std::vector<uint8_t> raw(outCount * elem);
      const void* out = o.coll == Coll::ReduceScatter ? ranks[r].send : ranks[r].recv;
      braid::peers::NcclDeviceCalls::check(device.copy(raw.data(), out, raw.size()), kName,
                                           "copying out");
      for (size_t i = 0; i < outCount; ++i) {
        float got;
        if (o.bf16) {
          uint16_t bits;
          memcpy(&bits, raw.data() + i * 2, 2);
          got = fromBf16(bits);
        } else {
          memcpy(&got, raw.data() + i * 4, 4);
        }
        double want;
        switch (o.coll) {
          case Coll::AllReduce:
          case Coll::Reduce:
            want = sum * (i % 7 + 1);
            break;
          case Coll::ReduceScatter:
            want = sum * ((r * count + i) % 7 + 1);
            break;
          case Coll::AllGather:
            want = static_cast<double>(i / count + 1) * (i % count % 7 + 1);
            break;
          default:  // broadcast of the root's part
            want = static_cast<double>(root + 1) * (i % 7 + 1);
            break;
        }
        wrong += got == static_cast<float>(want) ? 0 : 1;
      }
    }
    wrongTotal += wrong;

    for (int i = 0; i < o.warmup; ++i) issueAll(count);
    synchronizeAll();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) issueAll(count);
    synchronizeAll();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / o.iters;
    const double algbw = static_cast<double>(total * elem) / seconds / 1e9;
    printf("  %10zu %12zu %9s %7s %7d %8.2f %7.2f %7.2f %6lld\n", total * elem, total,
           o.bf16 ? "bfloat16" : "float32",
           o.coll == Coll::AllGather || o.coll == Coll::Broadcast ? "none" : "sum",
           o.coll == Coll::Broadcast || o.coll == Coll::Reduce ? root : -1, seconds * 1e6, algbw,
           algbw * busFactor(o.coll, n), wrong);
    fflush(stdout);
  }
  for (Rank& rank : ranks) {
    NCCL(ncclMemFree(rank.send));
    NCCL(ncclMemFree(rank.recv));
    braid::peers::NcclDeviceCalls::check(device.streamDestroy(rank.stream), kName,
                                         "destroying a stream");
    NCCL(ncclCommDestroy(rank.comm));
  }
  printf("# Out of bounds values : %lld %s\n", wrongTotal, wrongTotal == 0 ? "OK" : "WRONG");
  return wrongTotal == 0 ? 0 : 1;
}
