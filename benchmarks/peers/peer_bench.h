// What the peer benchmarks (benchmarks/peers/*_allreduce.cc) share: the
// command line, the timing loop, the correctness check and the output, all in
// braid-perf's units and layout, so one script reads braid-perf's and the
// peers' results alike.
//
// A peer program implements Collectives over its library (MPI, Gloo, ...) and
// hands it to runAllReduce, which measures a float32 sum all-reduce at every
// size the way braid-perf does (see benchmarks/braid_perf.cc):
//   - time per call = mean over -n calls after -w warm-up calls and a barrier,
//     the slowest rank's (max over ranks);
//   - algbw = bytes / time in GB/s (1 GB = 1e9 B); busbw = algbw * 2(n-1)/n;
//   - with -c 1 (the default) one more call per size and placement on check
//     data, whose wrong elements are counted over all ranks; any wrong element
//     makes the run fail (exit 1), so a broken library cannot report a time.
// Out of place (send != recv) and then in place (send == recv), like
// braid-perf. Only rank 0 prints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/bench_cli.h"

namespace braid::peers {

// The command line: braid-perf's options that apply to one float32 sum
// all-reduce, plus -A for the library's algorithm where it offers a choice.
struct Options {
  size_t minBytes = size_t{32} << 20;  // -b
  size_t maxBytes = size_t{32} << 20;  // -e
  size_t stepFactor = 2;               // -f
  int iters = 20;                      // -n
  int warmup = 5;                      // -w
  bool check = true;                   // -c
  std::string jsonPath;                // -J
  std::string algorithm;               // -A; Default: the program's first algorithm
};

// What a program tells the parser about itself.
struct Program {
  const char* name;                     // e.g. "peer-ompi-allreduce"
  const char* launch;                   // how to start it, for the help
  std::vector<std::string> algorithms;  // values of -A, first = default; empty: no -A
};

using UsageError = bench::UsageError;  // a bad command line; what() names the option

// Fills `options`. Returns false when the help was asked for (and printed).
// Throws UsageError.
bool parseOptions(int argc, char** argv, const Program& program, Options* options);

// The sizes in bytes: minBytes, times stepFactor, up to maxBytes.
std::vector<size_t> sizeSteps(const Options& options);

// The library under test, for one communicator of size() ranks.
class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // One line naming the library and its version, for the header and JSON.
  virtual std::string library() const = 0;

  // Called before the calls of one measurement with the buffers they will
  // use (send == recv in place); a library that builds per-size state does
  // it here, outside the timing. Default: nothing.
  virtual void prepare(const float* send, float* recv, size_t count);
  // recv[i] = sum over ranks of send[i], i < count; send == recv in place.
  // Returns when this rank's result is complete.
  virtual void allReduce(const float* send, float* recv, size_t count) = 0;

  virtual double maxOverRanks(double value) = 0;
  virtual uint64_t sumOverRanks(uint64_t value) = 0;
  virtual void barrier() = 0;
};

// Measures every size; rank 0 prints the table and writes -J. Returns the
// exit code: 0, or 1 when any element was wrong.
int runAllReduce(Collectives& collectives, const Options& options, const Program& program);

}  // namespace braid::peers
