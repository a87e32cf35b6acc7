// braid-memcpy-bw: the machine's memory bandwidth with P processes at once,
// each running one kernel over its own buffers: the bound a host collective
// works against. Every rank must at least read its input and write its
// output, and each step of an algorithm is one of these kernels.
//
//   braid-memcpy-bw [-p 2] [-s 256M] [-r 10] [-J file.json]
//
// Kernels, STREAM-style, over float32 buffers a, b and c of -s bytes each:
//   memcpy        c = a with libc's memcpy
//   copy-stream   c = a with braid's streaming-store copy (reduce/streaming.h)
//   add           c = a + b with braid's float32 sum kernel, ordinary stores
//                 (STREAM's Add; its traffic is Triad's: two streams read,
//                 one written)
//   add-stream    c = a + b through braid's streaming-store reduction
//   add-inplace   a = a + b, what an in-place reduction does
// The parent forks P workers. Each allocates and touches its buffers (so no
// page fault is timed), then for each kernel and each of -r reps waits at a
// process-shared barrier and times one call over the whole buffers.
// Bandwidth is in GB/s of 1e9 bytes, per rep, best rep:
//   aggregate    = P * traffic / (last end - first start)
//   per process  = aggregate / P, what each gets while all run at once
//   solo best    = traffic / one call's own time, best over processes and reps
// where traffic counts, as STREAM does, the bytes read and written: 2 s for
// the copies, 3 s for the adds. For the memcpy line only (the first one, and
// the JSON's top-level fields) the bytes copied, s, count instead, so that a
// rank's algbw (bytes / time) compares with it directly.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "braid/types.h"
#include "reduce/reduce.h"
#include "reduce/streaming.h"

namespace {

constexpr const char* kUsage =
    "usage: braid-memcpy-bw [options]\n"
    "Memory bandwidth with P processes each running a copy or add kernel on its own\n"
    "buffers at once (memcpy, and braid's copy and reduce kernels).\n"
    "  -p, --procs N            processes (default 2)\n"
    "  -s, --size SIZE          bytes of each buffer, K M G suffixes (default 256M)\n"
    "  -r, --reps N             timed calls per kernel and process; the best counts\n"
    "                           (default 10)\n"
    "  -J, --output_file FILE   also write the results as JSON\n"
    "  -h, --help               print this help\n";

struct Options {
  int procs = 2;
  size_t bytes = size_t{256} << 20;
  int reps = 10;
  std::string jsonPath;
};

// The kernels, in the order they run and print.
struct KernelInfo {
  const char* name;
  int traffic;  // buffer sizes read plus written per call
};
constexpr KernelInfo kKernels[] = {
    {"memcpy", 2}, {"copy-stream", 2}, {"add", 3}, {"add-stream", 3}, {"add-inplace", 3}};
constexpr int kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

// What the workers share with the parent: one barrier, and each worker's
// start and end time (CLOCK_MONOTONIC, one clock for all processes) per
// kernel and rep.
struct Shared {
  pthread_barrier_t barrier;
  double times[1];  // [procs][kernels][reps][2], allocated past the struct
};

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "braid-memcpy-bw: %s (try braid-memcpy-bw -h)\n", message.c_str());
  std::exit(2);
}

long long intValue(const std::string& option, const char* text, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text, &end, 10);
  if (!*text || *end || errno || value < lo || value > hi)
    usageError(option + ": '" + text + "' is not an integer between " + std::to_string(lo) +
               " and " + std::to_string(hi));
  return value;
}

size_t bytesValue(const std::string& option, const char* text) {
  char* end = nullptr;
  double number = std::strtod(text, &end);
  std::string unit = end;
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();
  double scale = unit.empty() || unit == "b" ? 1
                 : unit == "k"               ? 1024.0
                 : unit == "m"               ? 1024.0 * 1024
                 : unit == "g"               ? 1024.0 * 1024 * 1024
                                             : 0;
  if (end == text || scale == 0 || number * scale < 1)
    usageError(option + ": '" + text + "' is not a size such as 64M or 1G");
  return static_cast<size_t>(number * scale);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usageError("unknown option or missing value '" + arg + "'");
    const char* value = argv[++i];
    if (arg == "-p" || arg == "--procs") {
      options.procs = static_cast<int>(intValue(arg, value, 1, 1024));
    } else if (arg == "-s" || arg == "--size") {
      options.bytes = bytesValue(arg, value);
    } else if (arg == "-r" || arg == "--reps") {
      options.reps = static_cast<int>(intValue(arg, value, 1, 1 << 20));
    } else if (arg == "-J" || arg == "--output_file") {
      options.jsonPath = value;
    } else {
      usageError("unknown option '" + arg + "'");
    }
  }
  return options;
}

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One call of kernel k over the worker's buffers.
void runKernel(int k, float* a, const float* b, float* c, size_t bytes) {
  static const braid::reduce::Kernel sum =
      braid::reduce::kernelFor(braid::DataType::Float32, braid::ReduceOp::Sum);
  const size_t count = bytes / sizeof(float);
  switch (k) {
    case 0:
      std::memcpy(c, a, bytes);
      break;
    case 1:
      braid::reduce::copyStreaming(c, a, bytes);
      break;
    case 2:
      sum(c, a, b, count);
      break;
    case 3:
      braid::reduce::reduceStreaming(sum, c, a, b, count, sizeof(float));
      break;
    default:
      sum(a, a, b, count);
      break;
  }
}

// One worker: touch its buffers, then time `reps` calls of each kernel.
// Exit code 0 or 1.
int work(Shared* shared, const Options& options, int index) {
  const size_t bytes = options.bytes / sizeof(float) * sizeof(float);
  auto* a = static_cast<float*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  auto* b = static_cast<float*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  auto* c = static_cast<float*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  const size_t count = bytes / sizeof(float);
  bool ok = a && b && c;
  if (ok) {
    std::fill(a, a + count, 0.0f);
    std::fill(b, b + count, 1.0f);
    std::fill(c, c + count, 0.0f);
  }
  double* times = shared->times + static_cast<size_t>(index) * kNumKernels * options.reps * 2;
  for (int k = 0; k < kNumKernels; ++k)
    for (int rep = 0; rep < options.reps; ++rep) {
      pthread_barrier_wait(&shared->barrier);  // every worker takes part, even a failed one
      double* slot = times + (static_cast<size_t>(k) * options.reps + rep) * 2;
      slot[0] = now();
      if (ok) runKernel(k, a, b, c, bytes);
      slot[1] = now();
    }
  // The calls really happened (and were not optimised away): after the
  // in-place adds, a holds the number of them; c was last written by
  // add-stream from an a of 0 and a b of 1.
  if (ok && count &&
      (a[0] != static_cast<float>(options.reps) || a[count - 1] != a[0] || c[count - 1] != 1.0f))
    ok = false;
  std::free(a);
  std::free(b);
  std::free(c);
  if (!ok) std::fprintf(stderr, "braid-memcpy-bw: worker %d: cannot allocate or compute\n", index);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);
  size_t timeCount = static_cast<size_t>(options.procs) * kNumKernels * options.reps * 2;
  size_t sharedBytes = sizeof(Shared) + timeCount * sizeof(double);
  void* mapping =
      mmap(nullptr, sharedBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    std::perror("braid-memcpy-bw: mmap");
    return 1;
  }
  Shared* shared = static_cast<Shared*>(mapping);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&shared->barrier, &attr, static_cast<unsigned>(options.procs));
  pthread_barrierattr_destroy(&attr);

  std::fflush(stdout);
  std::vector<pid_t> workers;
  for (int i = 0; i < options.procs; ++i) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("braid-memcpy-bw: fork");
      for (pid_t w : workers) kill(w, SIGKILL);
      return 1;
    }
    if (pid == 0) _exit(work(shared, options, i));
    workers.push_back(pid);
  }
  bool failed = false;
  for (pid_t w : workers) {
    int status = 0;
    if (waitpid(w, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = true;
  }
  if (failed) {
    std::fprintf(stderr, "braid-memcpy-bw: a worker failed\n");
    return 1;
  }

  // Per kernel: aggregate, per process and solo best, in traffic GB/s.
  struct Result {
    double aggregate = 0, perProcess = 0, solo = 0;
  };
  Result results[kNumKernels];
  const double* times = shared->times;
  for (int k = 0; k < kNumKernels; ++k) {
    auto at = [&](int p, int rep, int end) {
      return times[((static_cast<size_t>(p) * kNumKernels + k) * options.reps + rep) * 2 + end];
    };
    const double traffic = static_cast<double>(options.bytes) * kKernels[k].traffic;
    Result& r = results[k];
    for (int rep = 0; rep < options.reps; ++rep) {
      double first = at(0, rep, 0), last = at(0, rep, 1);
      for (int p = 1; p < options.procs; ++p) {
        first = std::min(first, at(p, rep, 0));
        last = std::max(last, at(p, rep, 1));
      }
      r.aggregate = std::max(r.aggregate, options.procs * traffic / (last - first) / 1e9);
      for (int p = 0; p < options.procs; ++p)
        r.solo = std::max(r.solo, traffic / (at(p, rep, 1) - at(p, rep, 0)) / 1e9);
    }
    r.perProcess = r.aggregate / options.procs;
  }
  // memcpy's bytes copied per second: half its traffic.
  const double aggregate = results[0].aggregate / 2, perProcess = results[0].perProcess / 2,
               solo = results[0].solo / 2;

  std::printf("# braid-memcpy-bw: %d processes, %zu bytes each, %d reps, best of; GB/s = 1e9 B/s\n",
              options.procs, options.bytes, options.reps);
  std::printf(
      "#   procs        bytes  aggregate  per-process    solo-best   (memcpy: bytes copied)\n");
  std::printf("%9d%13zu%11.2f%13.2f%13.2f\n", options.procs, options.bytes, aggregate, perProcess,
              solo);
  std::printf("#\n# every kernel, bytes read + written per second:\n");
  std::printf("#      kernel  aggregate  per-process    solo-best\n");
  for (int k = 0; k < kNumKernels; ++k)
    std::printf("%13s%11.2f%13.2f%13.2f\n", kKernels[k].name, results[k].aggregate,
                results[k].perProcess, results[k].solo);
  if (!options.jsonPath.empty()) {
    std::FILE* file = std::fopen(options.jsonPath.c_str(), "w");
    if (!file) {
      std::fprintf(stderr, "braid-memcpy-bw: cannot write %s: %s\n", options.jsonPath.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(file,
                 "{\n  \"program\": \"braid-memcpy-bw\",\n  \"procs\": %d,\n  \"bytes\": %zu,\n"
                 "  \"reps\": %d,\n  \"aggregate_gbps\": %.4f,\n  \"per_process_gbps\": %.4f,\n"
                 "  \"solo_best_gbps\": %.4f,\n  \"kernels\": [",
                 options.procs, options.bytes, options.reps, aggregate, perProcess, solo);
    for (int k = 0; k < kNumKernels; ++k)
      std::fprintf(file,
                   "%s\n    {\"name\": \"%s\", \"traffic\": %d, \"aggregate_gbps\": %.4f, "
                   "\"per_process_gbps\": %.4f, \"solo_best_gbps\": %.4f}",
                   k ? "," : "", kKernels[k].name, kKernels[k].traffic, results[k].aggregate,
                   results[k].perProcess, results[k].solo);
    std::fprintf(file, "\n  ]\n}\n");
    if (std::fclose(file) != 0) {
      std::fprintf(stderr, "braid-memcpy-bw: cannot write %s\n", options.jsonPath.c_str());
      return 1;
    }
  }
  pthread_barrier_destroy(&shared->barrier);
  munmap(mapping, sharedBytes);
  return 0;
}
