// braid-sim: runs braid's plans for N ranks in one process, with no
// transport, and predicts their time with an alpha-beta model.
//
//   braid-sim allreduce --ranks 1024 --algo ring,tree --bw 50GB/s --lat 5us
//
// For each size and algorithm it prints the predicted time and bus
// bandwidth (nccl-tests units) and marks the fastest; with --check it also
// verifies every rank's result on integers (small sizes only: the check
// keeps every rank's buffers in memory).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "algorithms/catalog.h"
#include "algorithms/simulate.h"
#include "benchmarks/bench_cli.h"

namespace {

using braid::algo::Algorithm;
using braid::algo::Collective;
using braid::bench::UsageError;

constexpr const char* kUsage =
    "usage: braid-sim <collective> --ranks N [options]\n"
    "  collective: allreduce, broadcast, reduce, allgather, reducescatter\n"
    "  -n, --ranks N          ranks to simulate (1..65536)\n"
    "      --algo LIST        algorithms to compare (default: every one the collective has;\n"
    "                         braid-info --algorithms lists them)\n"
    "      --bw RATE          bandwidth of each link, e.g. 50GB/s, 100Gb/s, 12.5GiB/s\n"
    "                         (default 50GB/s)\n"
    "      --lat TIME         latency of each message, e.g. 5us, 800ns, 1ms (default 5us)\n"
    "      --reduce-bw RATE   local reduction speed (default: free)\n"
    "      --copy-bw RATE     local copy speed, e.g. out of a received message (default: free)\n"
    "  -b, --minbytes SIZE    smallest size (default 8)\n"
    "  -e, --maxbytes SIZE    largest size (default 1G)\n"
    "  -f, --stepfactor N     multiply the size by N each step (default 8)\n"
    "      --chunk SIZE       pipeline chunk (default 1M, as BRAID_CHUNK_BYTES)\n"
    "      --elem BYTES       element size (default 4)\n"
    "      --root R           root of broadcast and reduce (default 0)\n"
    "      --check            also check every rank's result (sizes up to 1M only)\n"
    "  -h, --help             print this help\n"
    "Sizes are whole buffers in bytes, as in braid-perf (all-gather and reduce-scatter:\n"
    "the gathered buffer). busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for\n"
    "all-gather and reduce-scatter, 1 otherwise.\n";

// "50GB/s" -> bytes per second; "Gb/s" are bits.
double rateValue(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  std::string unit = end;
  double scale = 1;
  auto eat = [&](const char* prefix, double factor) {
    if (unit.rfind(prefix, 0) == 0) {
      scale *= factor;
      unit.erase(0, std::strlen(prefix));
      return true;
    }
    return false;
  };
  eat("Ki", 1024.0) || eat("Mi", 1048576.0) || eat("Gi", 1073741824.0) || eat("K", 1e3) ||
      eat("M", 1e6) || eat("G", 1e9) || eat("T", 1e12);
  if (unit == "B/s" || unit == "B" || unit.empty()) {
  } else if (unit == "b/s" || unit == "bit/s") {
    scale /= 8;
  } else {
    throw UsageError(option + ": '" + text + "' is not a rate such as 50GB/s or 100Gb/s");
  }
  if (!(number > 0)) throw UsageError(option + ": '" + text + "' must be positive");
  return number * scale;
}

// "5us" -> seconds.
double timeValue(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  const std::string unit = end;
  double scale;
  if (unit == "ns")
    scale = 1e-9;
  else if (unit == "us")
    scale = 1e-6;
  else if (unit == "ms")
    scale = 1e-3;
  else if (unit == "s")
    scale = 1;
  else
    throw UsageError(option + ": '" + text + "' is not a time such as 5us, 800ns or 1ms");
  if (!(number >= 0)) throw UsageError(option + ": '" + text + "' must not be negative");
  return number * scale;
}

std::string human(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && u < 4 && std::fmod(value, 1024) == 0) value /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f %s", value, units[u]);
  return text;
}

int run(int argc, char** argv) {
  Collective collective = Collective::AllReduce;
  bool haveCollective = false, check = false;
  int ranks = 0, root = 0;
  std::vector<Algorithm> algorithms;
  braid::algo::SimOptions options;
  options.link.bandwidth = 50e9;
  options.link.latency = 5e-6;
  size_t minBytes = 8, maxBytes = size_t{1} << 30, factor = 8;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) return arg.substr(eq + 1);
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    const std::string name = arg.substr(0, arg.find('='));
    if (name == "-h" || name == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (name == "-n" || name == "--ranks") {
      ranks = static_cast<int>(braid::bench::intValue(name, value(), 1, 65536));
    } else if (name == "--algo") {
      std::string list = value();
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = list.find(',', start);
        const std::string item =
            list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        Algorithm algorithm;
        if (!braid::algo::parseAlgorithm(item, &algorithm))
          throw UsageError("--algo: '" + item +
                           "' is not an algorithm (see braid-info --algorithms)");
        algorithms.push_back(algorithm);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (name == "--bw") {
      options.link.bandwidth = rateValue(name, value());
    } else if (name == "--lat") {
      options.link.latency = timeValue(name, value());
    } else if (name == "--reduce-bw") {
      options.link.reduceBandwidth = rateValue(name, value());
    } else if (name == "--copy-bw") {
      options.link.copyBandwidth = rateValue(name, value());
    } else if (name == "-b" || name == "--minbytes") {
      minBytes = braid::bench::bytesValue(name, value());
    } else if (name == "-e" || name == "--maxbytes") {
      maxBytes = braid::bench::bytesValue(name, value());
    } else if (name == "-f" || name == "--stepfactor") {
      factor = static_cast<size_t>(braid::bench::intValue(name, value(), 2, 1 << 20));
    } else if (name == "--chunk") {
      options.chunkBytes = braid::bench::bytesValue(name, value());
    } else if (name == "--elem") {
      options.elemSize = static_cast<size_t>(braid::bench::intValue(name, value(), 1, 8));
    } else if (name == "--root") {
      root = static_cast<int>(braid::bench::intValue(name, value(), 0, 65535));
    } else if (name == "--check") {
      check = true;
    } else if (!arg.empty() && arg[0] != '-' && !haveCollective) {
      if (!braid::algo::parseCollective(arg, &collective) || collective == Collective::Send ||
          collective == Collective::Recv)
        throw UsageError("'" + arg +
                         "' is not a collective (allreduce, broadcast, reduce, allgather, "
                         "reducescatter)");
      haveCollective = true;
    } else {
      throw UsageError("unexpected argument '" + arg + "'");
    }
  }
  if (!haveCollective) throw UsageError("missing the collective (allreduce, broadcast, ...)");
  if (ranks == 0) throw UsageError("missing --ranks N");
  if (root >= ranks) throw UsageError("--root " + std::to_string(root) + " is not a rank");
  if (minBytes > maxBytes) throw UsageError("-b is larger than -e");
  if (algorithms.empty()) algorithms = braid::algo::algorithmsFor(collective);
  for (Algorithm a : algorithms) {
    const auto& known = braid::algo::algorithmsFor(collective);
    if (std::find(known.begin(), known.end(), a) == known.end())
      throw UsageError(std::string("--algo: ") + braid::algo::collectiveName(collective) +
                       " has no algorithm '" + braid::algo::algorithmName(a) + "' (it has " +
                       braid::algo::algorithmNames(collective) + ")");
  }

  const bool gathered =
      collective == Collective::AllGather || collective == Collective::ReduceScatter;
  const double n = ranks;
  const double factorBus = collective == Collective::AllReduce ? 2 * (n - 1) / n
                           : gathered                          ? (n - 1) / n
                                                               : 1;
  std::printf("# braid-sim %s, %d ranks, links %.4g GB/s and %.4g us, chunk %zu bytes%s\n",
              braid::algo::collectiveName(collective), ranks, options.link.bandwidth / 1e9,
              options.link.latency * 1e6, options.chunkBytes, check ? ", results checked" : "");
  std::printf("# %10s", "size");
  for (Algorithm a : algorithms)
    std::printf("  %14s us %8s", braid::algo::algorithmName(a), "busbw");
  std::printf("  best\n");
  for (size_t bytes = minBytes; bytes <= maxBytes;) {
    // Elements per rank (gathered collectives: per rank's block).
    size_t count = bytes / options.elemSize / (gathered ? ranks : 1);
    std::printf("  %10s", human(bytes).c_str());
    double best = 0;
    const char* bestName = "-";
    for (Algorithm a : algorithms) {
      braid::algo::Shape shape;
      shape.nranks = ranks;
      shape.count = count;
      shape.elemSize = options.elemSize;
      if (!braid::algo::applies(collective, a, shape)) {
        std::printf("  %17s %8s", "n/a", "");
        continue;
      }
      options.checkData = check && bytes <= (size_t{1} << 20);
      const braid::algo::SimResult result =
          braid::algo::simulate(collective, a, ranks, count, root, options);
      if (!result.problem.empty()) {
        std::fprintf(stderr, "braid-sim: %s at %zu bytes: %s\n", braid::algo::algorithmName(a),
                     bytes, result.problem.c_str());
        return 1;
      }
      const double us = result.seconds * 1e6;
      const double busbw =
          us > 0 ? count * options.elemSize * (gathered ? n : 1) / (us * 1e3) * factorBus : 0;
      std::printf("  %17.2f %8.3g", us, busbw);
      if (bestName[0] == '-' || us < best) best = us, bestName = braid::algo::algorithmName(a);
    }
    std::printf("  %s\n", bestName);
    if (bytes > maxBytes / factor) break;
    bytes *= factor;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "braid-sim: %s\n%s", error.what(), kUsage);
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "braid-sim: %s\n", error.what());
    return 1;
  }
}
