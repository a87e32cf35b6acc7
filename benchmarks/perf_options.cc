#include "benchmarks/perf_options.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace braid::perf {

namespace {

using bench::bytesValue;
using bench::intValue;

constexpr const char* kUsage =
    "usage: braid-perf <collective> [options]   (run it under braid-run -n N)\n"
    "       braid-perf -a [options]             every collective in one run\n"
    "  collective: allreduce, allgather, reducescatter, broadcast, reduce, sendrecv,\n"
    "              putsignal (one-sided; not part of -a)\n"
    "  -b, --minbytes SIZE      smallest size, e.g. 8, 64K, 1M (default 32M)\n"
    "  -e, --maxbytes SIZE      largest size (default 32M)\n"
    "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"
    "  -i, --stepbytes SIZE     add SIZE each step instead\n"
    "  -n, --iters N            timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"
    "  -c, --check 0|1          verify the results (default 1)\n"
    "  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half float double\n"
    "                           bfloat16 fp8e4m3 fp8e5m2, or all (default float)\n"
    "  -o, --op OP              sum prod max min avg, or all (default sum)\n"
    "  -r, --root N             root of broadcast and reduce (default 0)\n"
    "  -a, --all                every collective, one table each, one summary\n"
    "  -A, --average N          time reported: 0 rank 0's, 1 mean, 2 min, 3 max over\n"
    "                           ranks (default 3; nccl-tests calls this -a)\n"
    "  -R, --local_register 0|1|2  1: buffers from braid::memAlloc, which same-host\n"
    "                           peers read in place; 2 (with -G 1): device buffers\n"
    "                           registered as windows, which collectives reach into\n"
    "                           directly, as nccl-tests' -R 2 (default 0: neither)\n"
    "  -O, --offset BYTES       host buffers start rank x BYTES past a page (mod 4 KiB),\n"
    "                           as buffers cut out of larger ones do (default 0: on a page)\n"
    "  -G, --device 0|1         1: buffers in device memory of the communicator's device\n"
    "                           (BRAID_DEVICE picks it), every call enqueued on one device\n"
    "                           stream; the time covers the calls and a stream synchronize\n"
    "                           (default 0: host memory, host-synchronous calls)\n"
    "  -C, --graph N            with -G 1: the -n calls of a size are captured into a\n"
    "                           CUDA graph (once, untimed) and the graph launched N times;\n"
    "                           the time is per call (nccl-tests' -G; default 0: no graph)\n"
    "  -g, --ngpus N            N ranks in this one process, one per device (device\n"
    "                           i mod the devices there are; BRAID_DEVICE picks them),\n"
    "                           a thread each (default 1: one rank per process, from\n"
    "                           the launcher); run braid-perf alone, not under braid-run\n"
    "  -J, --output_file FILE   also write the results as JSON\n"
    "  -h, --help               print this help\n"
    "Sizes take K, M and G suffixes (powers of 1024). For allgather and reducescatter\n"
    "the size is the whole gathered buffer, as in nccl-tests.\n";

struct Flag {
  char letter;
  const char* name;
  bool takesValue;
};

constexpr Flag kFlags[] = {
    {'b', "minbytes", true},       {'e', "maxbytes", true}, {'f', "stepfactor", true},
    {'i', "stepbytes", true},      {'n', "iters", true},    {'w', "warmup_iters", true},
    {'c', "check", true},          {'d', "datatype", true}, {'o', "op", true},
    {'r', "root", true},           {'A', "average", true},  {'J', "output_file", true},
    {'R', "local_register", true}, {'G', "device", true},   {'a', "all", false},
    {'z', "blocking", false},      {'h', "help", false},    {'g', "ngpus", true},
    {'C', "graph", true},          {'O', "offset", true},
};

const std::pair<const char*, DataType> kTypeNames[] = {
    {"int8", DataType::Int8},          {"char", DataType::Int8},
    {"uint8", DataType::Uint8},        {"int32", DataType::Int32},
    {"int", DataType::Int32},          {"uint32", DataType::Uint32},
    {"int64", DataType::Int64},        {"uint64", DataType::Uint64},
    {"half", DataType::Float16},       {"float16", DataType::Float16},
    {"fp16", DataType::Float16},       {"float", DataType::Float32},
    {"float32", DataType::Float32},    {"fp32", DataType::Float32},
    {"double", DataType::Float64},     {"float64", DataType::Float64},
    {"fp64", DataType::Float64},       {"bfloat16", DataType::BFloat16},
    {"bf16", DataType::BFloat16},      {"fp8e4m3", DataType::Float8E4M3},
    {"f8e4m3", DataType::Float8E4M3},  {"e4m3", DataType::Float8E4M3},
    {"fp8e5m2", DataType::Float8E5M2}, {"f8e5m2", DataType::Float8E5M2},
    {"e5m2", DataType::Float8E5M2},
};

const std::pair<const char*, ReduceOp> kOpNames[] = {
    {"sum", ReduceOp::Sum}, {"prod", ReduceOp::Prod}, {"max", ReduceOp::Max},
    {"min", ReduceOp::Min}, {"avg", ReduceOp::Avg},
};

const std::pair<const char*, Collective> kCollectiveNames[] = {
    {"allreduce", Collective::AllReduce},
    {"allgather", Collective::AllGather},
    {"reducescatter", Collective::ReduceScatter},
    {"broadcast", Collective::Broadcast},
    {"reduce", Collective::Reduce},
    {"sendrecv", Collective::SendRecv},
    {"putsignal", Collective::PutSignal},
};

std::vector<DataType> typesValue(const std::string& option, const std::string& text) {
  if (text == "all") {
    std::vector<DataType> all;
    all.reserve(kNumDataTypes);
    for (int t = 0; t < kNumDataTypes; ++t) all.push_back(static_cast<DataType>(t));
    return all;
  }
  for (const auto& [name, type] : kTypeNames)
    if (text == name) return {type};
  throw UsageError(option + ": unknown data type '" + text + "'");
}

std::vector<ReduceOp> opsValue(const std::string& option, const std::string& text) {
  if (text == "all") {
    std::vector<ReduceOp> all;
    all.reserve(kNumReduceOps);
    for (int o = 0; o < kNumReduceOps; ++o) all.push_back(static_cast<ReduceOp>(o));
    return all;
  }
  for (const auto& [name, op] : kOpNames)
    if (text == name) return {op};
  throw UsageError(option + ": unknown reduction operator '" + text + "'");
}

Collective collectiveValue(const std::string& text) {
  std::string name;
  for (char c : text)
    if (c != '_' && c != '-') name += c;  // all_reduce, reduce-scatter
  for (const auto& [known, collective] : kCollectiveNames)
    if (name == known) return collective;
  throw UsageError(
      "unknown collective '" + text +
      "' (allreduce, allgather, reducescatter, broadcast, reduce, sendrecv, putsignal)");
}

}  // namespace

const char* collectiveName(Collective collective) {
  for (const auto& [name, c] : kCollectiveNames)
    if (c == collective) return name;
  return "invalid";
}

bool reduces(Collective collective) {
  return collective == Collective::AllReduce || collective == Collective::ReduceScatter ||
         collective == Collective::Reduce;
}

bool hasRoot(Collective collective) {
  return collective == Collective::Broadcast || collective == Collective::Reduce;
}

bool gathered(Collective collective) {
  return collective == Collective::AllGather || collective == Collective::ReduceScatter;
}

double busBandwidthFactor(Collective collective, int nranks) {
  double n = nranks;
  switch (collective) {
    case Collective::AllReduce:
      return 2 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter:
      return (n - 1) / n;
    default:
      return 1;
  }
}

const char* averageName(Average average) {
  switch (average) {
    case Average::Rank0:
      return "rank 0's";
    case Average::Mean:
      return "mean over ranks";
    case Average::Min:
      return "min over ranks";
    case Average::Max:
      return "max over ranks";
  }
  return "invalid";
}

std::vector<Collective> allCollectives() {
  std::vector<Collective> all;
  for (const auto& [name, collective] : kCollectiveNames) {
    (void)name;
    if (collective == Collective::PutSignal) continue;  // one-sided: named on its own
    if (std::find(all.begin(), all.end(), collective) == all.end()) all.push_back(collective);
  }
  return all;
}

bool parseOptions(int argc, char** argv, Options* options) {
  bool haveCollective = false, haveFactor = false, haveAll = false;
  bool positionalOnly = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (positionalOnly || arg.size() < 2 || arg[0] != '-') {
      if (haveCollective) throw UsageError("unexpected argument '" + arg + "'");
      options->collectives = {collectiveValue(arg)};
      haveCollective = true;
      continue;
    }
    if (arg == "--") {
      positionalOnly = true;
      continue;
    }
    // Find the flag: "-b 8", "-b8", "--minbytes 8" or "--minbytes=8".
    const Flag* flag = nullptr;
    std::string option, value;
    bool inlineValue = false;
    if (arg[1] == '-') {
      size_t eq = arg.find('=');
      std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      for (const Flag& f : kFlags)
        if (name == f.name) flag = &f;
      option = "--" + name;
      if (eq != std::string::npos) value = arg.substr(eq + 1), inlineValue = true;
    } else {
      for (const Flag& f : kFlags)
        if (arg[1] == f.letter) flag = &f;
      option = arg.substr(0, 2);
      if (arg.size() > 2) value = arg.substr(2), inlineValue = true;
    }
    if (!flag) throw UsageError("unknown option '" + option + "'");
    if (flag->takesValue && !inlineValue) {
      if (i + 1 >= argc) throw UsageError(option + " needs a value");
      value = argv[++i];
    } else if (!flag->takesValue && inlineValue) {
      throw UsageError(option + " takes no value");
    }

    switch (flag->letter) {
      case 'h':
        std::fputs(kUsage, stdout);
        return false;
      case 'z':
        throw UsageError(option +
                         " (blocking) is not supported: braid-perf waits for every host call, "
                         "and with -G 1 synchronizes the stream after the timed calls");
      case 'b':
        options->minBytes = bytesValue(option, value);
        break;
      case 'e':
        options->maxBytes = bytesValue(option, value);
        break;
      case 'f':
        options->stepFactor = static_cast<size_t>(intValue(option, value, 2, 1 << 20));
        haveFactor = true;
        break;
      case 'i':
        options->stepBytes = bytesValue(option, value);
        break;
      case 'n':
        options->iters = static_cast<int>(intValue(option, value, 1, 1 << 30));
        break;
      case 'w':
        options->warmup = static_cast<int>(intValue(option, value, 0, 1 << 30));
        break;
      case 'c':
        options->check = intValue(option, value, 0, 1) == 1;
        break;
      case 'd':
        options->types = typesValue(option, value);
        break;
      case 'o':
        options->ops = opsValue(option, value);
        break;
      case 'r':
        options->root = static_cast<int>(intValue(option, value, 0, 1 << 30));
        break;
      case 'A':
        options->average = static_cast<Average>(intValue(option, value, 0, 3));
        break;
      case 'a':
        options->collectives = allCollectives();
        haveAll = true;
        break;
      case 'R':
        options->registration = static_cast<int>(intValue(option, value, 0, 2));
        break;
      case 'O':
        options->offset = static_cast<size_t>(intValue(option, value, 0, 4095));
        break;
      case 'G':
        options->onDevice = intValue(option, value, 0, 1) == 1;
        break;
      case 'C':
        options->graphLaunches = static_cast<int>(intValue(option, value, 0, 1000000));
        break;
      case 'g':
        options->gpus = static_cast<int>(intValue(option, value, 1, 64));
        break;
      case 'J':
        if (value.empty()) throw UsageError(option + " needs a file name");
        options->jsonPath = value;
        break;
    }
  }
  if (haveCollective && haveAll)
    throw UsageError("-a runs every collective: name none, or drop -a");
  if (haveAll) options->collectives = allCollectives();
  if (!haveCollective && !haveAll)
    throw UsageError(
        "missing the collective (allreduce, allgather, reducescatter, broadcast, reduce, "
        "sendrecv, putsignal)");
  if (options->minBytes > options->maxBytes)
    throw UsageError("-b (" + std::to_string(options->minBytes) + ") is larger than -e (" +
                     std::to_string(options->maxBytes) + ")");
  if (options->onDevice && options->registration == 1)
    throw UsageError("-G 1 and -R 1 exclude each other: -R 1 registers host memory");
  if (options->onDevice && options->offset > 0)
    throw UsageError("-O shifts host buffers: drop it with -G 1");
  if (!options->onDevice && options->registration == 2)
    throw UsageError("-R 2 registers device buffers as windows: it needs -G 1");
  if (options->graphLaunches > 0 && !options->onDevice)
    throw UsageError("-C captures device calls into a CUDA graph: it needs -G 1");
  if (options->graphLaunches > 0 &&
      std::find(options->collectives.begin(), options->collectives.end(), Collective::SendRecv) !=
          options->collectives.end())
    throw UsageError("-C: sendrecv's grouped send and receive cannot be captured into a graph yet");
  if (options->graphLaunches > 0 &&
      std::find(options->collectives.begin(), options->collectives.end(), Collective::PutSignal) !=
          options->collectives.end())
    throw UsageError("-C: one-sided puts cannot be captured into a graph");
  if (haveFactor && options->stepBytes > 0)
    throw UsageError("-f and -i exclude each other: step by a factor or by bytes");
  return true;
}

std::vector<size_t> sizeSteps(const Options& options) {
  return bench::sizeSteps(options.minBytes, options.maxBytes, options.stepFactor,
                          options.stepBytes);
}

size_t elementCount(Collective collective, size_t bytes, DataType type, int nranks) {
  size_t perRank = bytes / dataTypeSize(type);
  if (gathered(collective)) perRank /= static_cast<size_t>(nranks);
  return std::max<size_t>(1, perRank);
}

size_t reportedBytes(Collective collective, size_t count, DataType type, int nranks) {
  size_t bytes = count * dataTypeSize(type);
  return gathered(collective) ? bytes * static_cast<size_t>(nranks) : bytes;
}

}  // namespace braid::perf
