// braid-bench-ddp: does GradSync overlap communication with the backward
// pass? A simulated backward walks the layers from the last, "computing"
// each for a set time and then marking its gradient ready; the step ends
// with finish(). Three timings per bucket size, each the slowest rank's
// median over the measured steps:
//   compute   the backward alone (no GradSync)
//   comm      GradSync alone (every gradient ready at once, then finish)
//   step      the backward with GradSync, as a trainer runs it
// With overlap, step is close to max(compute, comm), not their sum.
//
// The compute is a wait, not a busy loop: a GPU's backward leaves the host
// free, and on a host with fewer cores than threads a busy loop would only
// measure the scheduler (--busy spins instead).
//
//   braid-run -n 2 build/bin/braid-bench-ddp [--layers 16] [--layer-bytes 4M]
//       [--compute-us 1000] [--steps 10] [--buckets 1M,25M,100M] [--busy] [--views]
//
// --views keeps the gradients inside the buckets (Options::
// gradientsAsBucketViews): markReady copies nothing, so the backward's
// thread does no work of its own while the buckets travel.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "braid/ddp.h"
#include "core/knobs.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int layers = 16;
  size_t layerBytes = size_t{4} << 20;
  int computeUs = 1000;
  int steps = 10;
  std::vector<size_t> buckets = {size_t{1} << 20, size_t{25} << 20, size_t{100} << 20};
  bool busy = false;
  bool views = false;  // gradients as bucket views: no copy in or out
};

[[noreturn]] void usage(int status) {
  std::fprintf(status ? stderr : stdout,
               "usage: braid-bench-ddp [--layers N] [--layer-bytes SIZE] [--compute-us N] "
               "[--steps N] [--buckets SIZE,SIZE,...] [--busy] [--views]\n");
  std::exit(status);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage(0);
    if (flag == "--busy" || flag == "--views") {
      (flag == "--busy" ? args.busy : args.views) = true;
      continue;
    }
    if (i + 1 >= argc) usage(2);
    const std::string value = argv[++i];
    if (flag == "--layers") {
      args.layers = static_cast<int>(braid::parseInt(value, "--layers"));
    } else if (flag == "--layer-bytes") {
      args.layerBytes = braid::parseBytes(value, "--layer-bytes");
    } else if (flag == "--compute-us") {
      args.computeUs = static_cast<int>(braid::parseInt(value, "--compute-us"));
    } else if (flag == "--steps") {
      args.steps = static_cast<int>(braid::parseInt(value, "--steps"));
    } else if (flag == "--buckets") {
      args.buckets.clear();
      size_t start = 0;
      while (start <= value.size()) {
        size_t end = value.find(',', start);
        if (end == std::string::npos) end = value.size();
        args.buckets.push_back(braid::parseBytes(value.substr(start, end - start), "--buckets"));
        start = end + 1;
      }
    } else {
      usage(2);
    }
  }
  if (args.layers < 1 || args.layerBytes < 4 || args.computeUs < 0 || args.steps < 1) usage(2);
  return args;
}

void compute(int microseconds, bool busy) {
  const auto until = Clock::now() + std::chrono::microseconds(microseconds);
  if (!busy) {
    std::this_thread::sleep_until(until);
    return;
  }
  while (Clock::now() < until) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    braid::Communicator comm = braid::Communicator::fromEnvironment();
    const size_t floats = args.layerBytes / sizeof(float);
    std::vector<std::vector<float>> grads(static_cast<size_t>(args.layers),
                                          std::vector<float>(floats, 1.0f));
    std::vector<braid::ddp::Parameter> params;
    for (int l = 0; l < args.layers; ++l)
      params.push_back({"layer" + std::to_string(l), grads[l].data(), floats,
                        braid::DataType::Float32, nullptr});

    // The slowest rank's median of `steps` runs of `body`.
    auto measure = [&](const auto& body) {
      std::vector<double> seconds;
      for (int s = 0; s < args.steps + 2; ++s) {  // two warm-up steps (the first rebuilds buckets)
        comm.barrier();
        const auto start = Clock::now();
        body();
        if (s >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
      double median = seconds[seconds.size() / 2], slowest = 0;
      comm.allReduce(&median, &slowest, 1, braid::DataType::Float64, braid::ReduceOp::Max);
      return slowest * 1e3;
    };

    if (comm.rank() == 0) {
      std::printf(
          "# braid-bench-ddp: %d ranks, %d layers of %zu bytes (fp32), %d us of compute "
          "per layer (%s), gradients %s, median of %d steps\n",
          comm.size(), args.layers, floats * sizeof(float), args.computeUs,
          args.busy ? "busy" : "waiting", args.views ? "as bucket views" : "copied", args.steps);
      std::printf("# %12s %8s %11s %11s %11s %11s %11s %10s\n", "bucket cap", "buckets",
                  "compute ms", "comm ms", "step ms", "max ms", "sum ms", "step/max");
    }
    const double computeMs = measure([&] {
      for (int l = args.layers - 1; l >= 0; --l) compute(args.computeUs, args.busy);
    });
    for (size_t cap : args.buckets) {
      braid::ddp::Options options;
      options.bucketCapBytes = cap;
      options.firstBucketBytes = std::min(options.firstBucketBytes, cap);
      options.gradientsAsBucketViews = args.views;
      braid::ddp::GradSync sync(comm, params, options);
      const double commMs = measure([&] {
        for (int l = args.layers - 1; l >= 0; --l) sync.markReady(static_cast<size_t>(l));
        sync.finish();
      });
      const double stepMs = measure([&] {
        for (int l = args.layers - 1; l >= 0; --l) {
          compute(args.computeUs, args.busy);
          sync.markReady(static_cast<size_t>(l));
        }
        sync.finish();
      });
      if (comm.rank() == 0) {
        const double most = std::max(computeMs, commMs), sum = computeMs + commMs;
        std::printf("  %12zu %8zu %11.2f %11.2f %11.2f %11.2f %11.2f %10.2f\n", cap,
                    sync.buckets().size(), computeMs, commMs, stepMs, most, sum, stepMs / most);
      }
    }
    return 0;
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "braid-bench-ddp: %s\n", error.what());
    return 1;
  }
}
