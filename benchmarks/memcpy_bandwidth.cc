// braid-memcpy-bw: the machine's memory-copy bandwidth with P processes at
// once, each copying its own buffer with memcpy. It bounds what a host
// all-reduce can reach: every rank must at least read its input and write its
// output, so a rank's algbw (bytes / time) cannot beat its share of this.
//
//   braid-memcpy-bw [-p 2] [-s 256M] [-r 10] [-J file.json]
//
// The parent forks P workers. Each allocates and touches a source and a
// destination buffer of -s bytes (so no page fault is timed), then for each
// of -r reps waits at a process-shared barrier and times one memcpy of the
// whole buffer. Bandwidth counts the bytes copied (one copy = -s bytes, not
// the read plus the write) per second, in GB/s of 1e9 bytes:
//   aggregate    = P * size / (last end - first start), per rep, best rep;
//   per process  = aggregate / P, what each gets while all copy at once;
//   solo best    = size / one copy's own time, best over processes and reps
//                  (near a lone process's rate when the copies did not
//                  overlap, e.g. on a busy machine).
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

namespace {

constexpr const char* kUsage =
    "usage: braid-memcpy-bw [options]\n"
    "Memory-copy bandwidth with P processes each copying its own buffer at once.\n"
    "  -p, --procs N            processes (default 2)\n"
    "  -s, --size SIZE          bytes each process copies, K M G suffixes (default 256M)\n"
    "  -r, --reps N             timed copies per process; the best counts (default 10)\n"
    "  -J, --output_file FILE   also write the results as JSON\n"
    "  -h, --help               print this help\n";

struct Options {
  int procs = 2;
  size_t bytes = size_t{256} << 20;
  int reps = 10;
  std::string jsonPath;
};

// What the workers share with the parent: one barrier, and each worker's
// start and end time (CLOCK_MONOTONIC, one clock for all processes) per rep.
struct Shared {
  pthread_barrier_t barrier;
  double times[1];  // [procs][reps][2], allocated past the struct
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

// One worker: touch both buffers, then time `reps` copies. Exit code 0 or 1.
int work(Shared* shared, const Options& options, int index) {
  unsigned char* src = static_cast<unsigned char*>(std::aligned_alloc(4096, options.bytes));
  unsigned char* dst = static_cast<unsigned char*>(std::aligned_alloc(4096, options.bytes));
  bool ok = src && dst;
  if (ok) {
    std::memset(src, index + 1, options.bytes);
    std::memset(dst, 0, options.bytes);
  }
  double* times = shared->times + static_cast<size_t>(index) * options.reps * 2;
  for (int rep = 0; rep < options.reps; ++rep) {
    pthread_barrier_wait(&shared->barrier);  // every worker takes part, even a failed one
    times[2 * rep] = now();
    if (ok) std::memcpy(dst, src, options.bytes);
    times[2 * rep + 1] = now();
  }
  // The copy really happened (and is not optimised away): check its ends.
  if (ok && (dst[0] != index + 1 || dst[options.bytes - 1] != index + 1)) ok = false;
  std::free(src);
  std::free(dst);
  if (!ok) std::fprintf(stderr, "braid-memcpy-bw: worker %d: cannot allocate or copy\n", index);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);
  size_t timeCount = static_cast<size_t>(options.procs) * options.reps * 2;
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

  const double* times = shared->times;
  auto start = [&](int p, int rep) {
    return times[(static_cast<size_t>(p) * options.reps + rep) * 2];
  };
  auto end = [&](int p, int rep) {
    return times[(static_cast<size_t>(p) * options.reps + rep) * 2 + 1];
  };
  double bytes = static_cast<double>(options.bytes);
  double aggregate = 0;
  for (int rep = 0; rep < options.reps; ++rep) {
    double first = start(0, rep), last = end(0, rep);
    for (int p = 1; p < options.procs; ++p) {
      first = std::min(first, start(p, rep));
      last = std::max(last, end(p, rep));
    }
    aggregate = std::max(aggregate, options.procs * bytes / (last - first) / 1e9);
  }
  double perProcess = aggregate / options.procs;
  double solo = 0;
  for (int p = 0; p < options.procs; ++p)
    for (int rep = 0; rep < options.reps; ++rep)
      solo = std::max(solo, bytes / (end(p, rep) - start(p, rep)) / 1e9);

  std::printf("# braid-memcpy-bw: %d processes, %zu bytes each, %d reps, best of; GB/s = 1e9 B/s\n",
              options.procs, options.bytes, options.reps);
  std::printf("#   procs        bytes  aggregate  per-process    solo-best\n");
  std::printf("%9d%13zu%11.2f%13.2f%13.2f\n", options.procs, options.bytes, aggregate, perProcess,
              solo);
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
                 "  \"solo_best_gbps\": %.4f\n}\n",
                 options.procs, options.bytes, options.reps, aggregate, perProcess, solo);
    if (std::fclose(file) != 0) {
      std::fprintf(stderr, "braid-memcpy-bw: cannot write %s\n", options.jsonPath.c_str());
      return 1;
    }
  }
  pthread_barrier_destroy(&shared->barrier);
  munmap(mapping, sharedBytes);
  return 0;
}
