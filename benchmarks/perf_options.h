// braid-perf's command line, and the facts about each collective it measures
// (which take an operator or a root, how big their buffers are, and the
// nccl-tests bus-bandwidth factor).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/bench_cli.h"
#include "braid/types.h"

namespace braid::perf {

// PutSignal: each rank puts into the next rank's host window with a signal
// and waits for the previous rank's (one-sided; not part of -a).
enum class Collective {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  Reduce,
  SendRecv,
  PutSignal
};

const char* collectiveName(Collective collective);
// Takes a ReduceOp (allreduce, reducescatter, reduce).
bool reduces(Collective collective);
// Takes a root (broadcast, reduce).
bool hasRoot(Collective collective);
// Its size is the whole gathered buffer, nranks times one rank's part
// (allgather, reducescatter).
bool gathered(Collective collective);
// busbw = algbw * factor: 2(n-1)/n for allreduce, (n-1)/n for allgather and
// reducescatter, 1 for the rest. Makes busbw comparable with the hardware's
// bandwidth whatever the rank count (the nccl-tests convention).
double busBandwidthFactor(Collective collective, int nranks);

// How the per-rank times of one measurement become the reported time.
enum class Average { Rank0 = 0, Mean = 1, Min = 2, Max = 3 };
const char* averageName(Average average);

struct Options {
  std::vector<Collective> collectives = {Collective::AllReduce};  // the name, or -a
  size_t minBytes = size_t{32} << 20;                             // -b
  size_t maxBytes = size_t{32} << 20;                             // -e
  size_t stepFactor = 2;  // -f: next size = size * stepFactor ...
  size_t stepBytes = 0;   // -i: ... or size + stepBytes when this is > 0
  int iters = 20;         // -n: timed iterations per size
  int warmup = 5;         // -w: untimed iterations before them
  bool check = true;      // -c: verify one run per size and placement
  std::vector<DataType> types = {DataType::Float32};  // -d
  std::vector<ReduceOp> ops = {ReduceOp::Sum};        // -o
  int root = 0;                                       // -r
  Average average = Average::Max;                     // -A
  // -R: 1, host buffers from braid::memAlloc; 2 (with -G 1), device buffers
  // registered as windows (Communicator::registerWindow), NCCL's symmetric
  // registration.
  int registration = 0;
  // -O: host buffers start rank * offset bytes past a page (mod 4 KiB).
  size_t offset = 0;
  // -g: ranks (devices) driven by this one process, one thread each, made
  // with Communicator::initAll; 1: one rank per process, from the launcher.
  int gpus = 1;
  bool onDevice = false;  // -G: device buffers, device stream
  int graphLaunches = 0;  // -C: with -G, time N launches of a graph of the -n calls
  std::string jsonPath;   // -J: also write the results here
};

using UsageError = bench::UsageError;  // a bad command line; what() names the option

// Fills `options` from the command line. Returns false when the user asked
// for the help (already printed). Throws UsageError.
bool parseOptions(int argc, char** argv, Options* options);

// Every collective braid-perf knows, in the order -a runs them.
std::vector<Collective> allCollectives();

// The sizes to measure, in bytes: minBytes, then by stepFactor (or
// stepBytes) up to maxBytes.
std::vector<size_t> sizeSteps(const Options& options);

// Elements per rank for a size in bytes (at least 1), and the bytes that
// count really moves (the size column).
size_t elementCount(Collective collective, size_t bytes, DataType type, int nranks);
size_t reportedBytes(Collective collective, size_t count, DataType type, int nranks);

}  // namespace braid::perf
