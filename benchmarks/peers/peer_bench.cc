#include "benchmarks/peers/peer_bench.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "benchmarks/bench_cli.h"

namespace braid::peers {

using bench::bytesValue;
using bench::formatTime;
using bench::intValue;

namespace {

constexpr size_t kAlignment = 4096;

void printUsage(const Program& program) {
  std::printf(
      "usage: %s [options]   (%s)\n"
      "Times a float32 sum all-reduce like braid-perf allreduce, same columns and units.\n"
      "  -b, --minbytes SIZE      smallest size, e.g. 8, 64K, 1M (default 32M)\n"
      "  -e, --maxbytes SIZE      largest size (default 32M)\n"
      "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"
      "  -n, --iters N            timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"
      "  -c, --check 0|1          verify the results (default 1)\n"
      "  -J, --output_file FILE   also write the results as JSON (braid-perf's shape)\n",
      program.name, program.launch);
  if (!program.algorithms.empty()) {
    std::string names;
    for (const std::string& a : program.algorithms) names += (names.empty() ? "" : ", ") + a;
    std::printf("  -A, --algorithm NAME     %s (default %s)\n", names.c_str(),
                program.algorithms.front().c_str());
  }
  std::printf(
      "  -h, --help               print this help\n"
      "Sizes take K, M and G suffixes (powers of 1024). The reported time is the\n"
      "slowest rank's mean time per call.\n");
}

// One page-aligned float buffer.
class Buffer {
 public:
  explicit Buffer(size_t count) {
    size_t bytes =
        (std::max<size_t>(count * sizeof(float), 1) + kAlignment - 1) / kAlignment * kAlignment;
    data_.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
    if (!data_) throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes");
  }
  float* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
};

// The check data. Every input is an integer in [0, 63], so every partial sum,
// in any order, is an integer far below 2^24 and exact in float; the output
// is first filled with -1, which no sum of them is.
float input(int rank, size_t index) { return static_cast<float>((index * 7 + rank * 3) % 64); }

void prepareCheck(int rank, float* send, float* recv, size_t count) {
  for (size_t i = 0; i < count; ++i) send[i] = input(rank, i);
  if (recv != send) std::fill(recv, recv + count, -1.0f);
}

uint64_t countWrong(int nranks, const float* recv, size_t count) {
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    float expected = 0;
    for (int r = 0; r < nranks; ++r) expected += input(r, i);
    if (recv[i] != expected) ++wrong;
  }
  return wrong;
}

struct Measurement {
  double timeUs = 0;
  double algbw = 0;  // GB/s, 1e9 bytes per second
  double busbw = 0;
  bool checked = false;
  uint64_t wrong = 0;  // over all ranks
};

struct Row {
  size_t bytes;
  size_t count;
  Measurement outOfPlace, inPlace;
};

// JSON string contents: quotes, backslashes and control characters escaped.
std::string jsonEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

class Runner {
 public:
  Runner(Collectives& c, const Options& options, const Program& program)
      : c_(c), options_(options), program_(program), rank_(c.rank()), nranks_(c.size()) {}

  int run();

 private:
  Measurement measure(size_t count, bool inPlace);
  void printHeader(const std::vector<size_t>& sizes) const;
  void printRow(const Row& row) const;
  void writeJson(const std::vector<Row>& rows, uint64_t wrong, double avgBusbw) const;

  Collectives& c_;
  const Options& options_;
  const Program& program_;
  int rank_;
  int nranks_;
  std::unique_ptr<Buffer> send_, recv_;
};

Measurement Runner::measure(size_t count, bool inPlace) {
  float* recv = recv_->data();
  float* send = inPlace ? recv : send_->data();
  prepareCheck(rank_, send, recv, count);  // the timed calls run on ordinary numbers too
  c_.prepare(send, recv, count);

  for (int i = 0; i < options_.warmup; ++i) c_.allReduce(send, recv, count);
  c_.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options_.iters; ++i) c_.allReduce(send, recv, count);
  std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;

  Measurement m;
  m.timeUs = c_.maxOverRanks(elapsed.count() / options_.iters);
  double bytes = static_cast<double>(count * sizeof(float));
  m.algbw = m.timeUs > 0 ? bytes / (m.timeUs * 1e3) : 0;
  m.busbw = m.algbw * 2.0 * (nranks_ - 1) / nranks_;
  if (options_.check) {
    prepareCheck(rank_, send, recv, count);
    c_.allReduce(send, recv, count);
    m.checked = true;
    m.wrong = c_.sumOverRanks(countWrong(nranks_, recv, count));
  }
  return m;
}

void Runner::printHeader(const std::vector<size_t>& sizes) const {
  std::printf("# %s, %s\n", program_.name, c_.library().c_str());
  std::printf(
      "# nranks %d, collective allreduce, dtype float32, op sum, root -1, iters %d, warmup %d, "
      "check %d\n",
      nranks_, options_.iters, options_.warmup, options_.check ? 1 : 0);
  if (!options_.algorithm.empty()) std::printf("# algorithm %s\n", options_.algorithm.c_str());
  std::printf("# sizes %zu to %zu bytes, step factor %zu; time per call: max over ranks\n#\n",
              sizes.front(), sizes.back(), options_.stepFactor);
  std::string titles(116, ' ');
  titles[0] = '#';
  titles.replace(62, 12, "out-of-place");
  titles.replace(96, 8, "in-place");
  titles.erase(titles.find_last_not_of(' ') + 1);
  std::printf("%s\n", titles.c_str());
  std::printf(
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
      "time   algbw   busbw #wrong\n");
  std::printf(
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
      "(us)  (GB/s)  (GB/s)\n");
  std::fflush(stdout);
}

void Runner::printRow(const Row& row) const {
  std::printf("%12zu%14zu%10s%8s%8d", row.bytes, row.count, "float32", "sum", -1);
  for (const Measurement* m : {&row.outOfPlace, &row.inPlace}) {
    std::string wrong = m->checked ? std::to_string(m->wrong) : "N/A";
    std::printf("%9s%8.2f%8.2f%7s", formatTime(m->timeUs).c_str(), m->algbw, m->busbw,
                wrong.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

// braid-perf's -J shape, plus "program", "library" and "algorithm".
void Runner::writeJson(const std::vector<Row>& rows, uint64_t wrong, double avgBusbw) const {
  std::FILE* file = std::fopen(options_.jsonPath.c_str(), "w");
  if (!file)
    throw std::runtime_error("cannot write " + options_.jsonPath + ": " + std::strerror(errno));
  std::fprintf(file,
               "{\n  \"program\": \"%s\",\n  \"library\": \"%s\",\n  \"algorithm\": \"%s\",\n"
               "  \"collective\": \"allreduce\",\n  \"nranks\": %d,\n  \"iters\": %d,\n"
               "  \"warmup\": %d,\n  \"check\": %s,\n  \"time\": \"max over ranks\",\n"
               "  \"results\": [",
               jsonEscape(program_.name).c_str(), jsonEscape(c_.library()).c_str(),
               jsonEscape(options_.algorithm).c_str(), nranks_, options_.iters, options_.warmup,
               options_.check ? "true" : "false");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(
        file,
        "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"float32\", \"redop\": \"sum\", "
        "\"root\": -1",
        i ? "," : "", r.bytes, r.count);
    const std::pair<const char*, const Measurement*> placements[] = {
        {"out_of_place", &r.outOfPlace}, {"in_place", &r.inPlace}};
    for (const auto& [name, m] : placements) {
      std::string wrongText = m->checked ? std::to_string(m->wrong) : "null";
      std::fprintf(file,
                   ",\n     \"%s\": {\"time_us\": %.3f, \"algbw_gbps\": %.4f, "
                   "\"busbw_gbps\": %.4f, \"wrong\": %s}",
                   name, m->timeUs, m->algbw, m->busbw, wrongText.c_str());
    }
    std::fprintf(file, "}");
  }
  std::fprintf(file, "\n  ],\n  \"out_of_bounds\": %llu,\n  \"avg_busbw_gbps\": %.4f\n}\n",
               static_cast<unsigned long long>(wrong), avgBusbw);
  if (std::fclose(file) != 0)
    throw std::runtime_error("cannot write " + options_.jsonPath + ": " + std::strerror(errno));
}

int Runner::run() {
  std::vector<size_t> sizes = sizeSteps(options_);
  size_t maxCount = std::max<size_t>(1, sizes.back() / sizeof(float));
  send_ = std::make_unique<Buffer>(maxCount);
  recv_ = std::make_unique<Buffer>(maxCount);

  if (rank_ == 0) printHeader(sizes);
  std::vector<Row> rows;
  uint64_t wrong = 0;
  double busbwSum = 0;
  for (size_t size : sizes) {
    size_t count = std::max<size_t>(1, size / sizeof(float));
    Row row{count * sizeof(float), count, measure(count, false), measure(count, true)};
    wrong += row.outOfPlace.wrong + row.inPlace.wrong;
    busbwSum += row.outOfPlace.busbw + row.inPlace.busbw;
    if (rank_ == 0) printRow(row);
    rows.push_back(row);
  }
  double avgBusbw = rows.empty() ? 0 : busbwSum / (2 * static_cast<double>(rows.size()));
  if (rank_ == 0) {
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong),
                wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g\n#\n", avgBusbw);
    std::fflush(stdout);
    if (!options_.jsonPath.empty()) writeJson(rows, wrong, avgBusbw);
  }
  return wrong ? 1 : 0;
}

}  // namespace

void Collectives::prepare(const float*, float*, size_t) {}

bool parseOptions(int argc, char** argv, const Program& program, Options* options) {
  struct Flag {
    char letter;
    const char* name;
  };
  static constexpr Flag kFlags[] = {
      {'b', "minbytes"},    {'e', "maxbytes"},     {'f', "stepfactor"},
      {'n', "iters"},       {'w', "warmup_iters"}, {'c', "check"},
      {'J', "output_file"}, {'A', "algorithm"},    {'h', "help"},
  };
  if (!program.algorithms.empty()) options->algorithm = program.algorithms.front();
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') throw UsageError("unexpected argument '" + arg + "'");
    // "-b 8", "-b8", "--minbytes 8" or "--minbytes=8".
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
    if (!flag || (flag->letter == 'A' && program.algorithms.empty()))
      throw UsageError("unknown option '" + option + "'");
    if (flag->letter == 'h') {
      if (inlineValue) throw UsageError(option + " takes no value");
      printUsage(program);
      return false;
    }
    if (!inlineValue) {
      if (i + 1 >= argc) throw UsageError(option + " needs a value");
      value = argv[++i];
    }
    switch (flag->letter) {
      case 'b':
        options->minBytes = bytesValue(option, value);
        break;
      case 'e':
        options->maxBytes = bytesValue(option, value);
        break;
      case 'f':
        options->stepFactor = static_cast<size_t>(intValue(option, value, 2, 1 << 20));
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
      case 'J':
        if (value.empty()) throw UsageError(option + " needs a file name");
        options->jsonPath = value;
        break;
      case 'A':
        if (std::find(program.algorithms.begin(), program.algorithms.end(), value) ==
            program.algorithms.end())
          throw UsageError(option + ": unknown algorithm '" + value + "'");
        options->algorithm = value;
        break;
    }
  }
  if (options->minBytes > options->maxBytes)
    throw UsageError("-b (" + std::to_string(options->minBytes) + ") is larger than -e (" +
                     std::to_string(options->maxBytes) + ")");
  return true;
}

int runAllReduce(Collectives& collectives, const Options& options, const Program& program) {
  return Runner(collectives, options, program).run();
}

std::vector<size_t> sizeSteps(const Options& options) {
  return bench::sizeSteps(options.minBytes, options.maxBytes, options.stepFactor, 0);
}

}  // namespace braid::peers
