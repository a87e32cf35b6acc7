// The plan simulator: runs every rank's plan of a collective in one process,
// with no transport, and checks it.
//
// Each rank gets integer inputs; messages travel through unbounded queues
// per ordered pair of ranks. The run fails if a receive finds a message of
// another size, if ranks stop with steps left (a deadlock) or messages
// unread, or if any rank's output is not the collective's result (sum,
// computed independently). Alongside, an alpha-beta model estimates the
// time: a message of b bytes leaves when its sender gets to it and its link
// is free, occupies the sender and the link b / bandwidth, and arrives
// latency later; a rank's clock moves to each arrival it waits for. Local
// work costs the rank's clock too: b / copyBandwidth for each copy a step
// makes (a received message into memory, a Copy step), b / reduceBandwidth
// for each reduction. A reduction whose result goes straight to the link
// (RecvReduceSend) overlaps the two: the longer one counts.
//
// For the collectives that reduce, the data check also counts finalizing
// steps (Avg's division): a finalize negates the values it produces, and
// the expected result is the negated sum, so a value finalized twice, or
// never, or a partial sum finalized and then added to, fails the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms/catalog.h"

namespace braid::algo {

struct LinkModel {
  double latency = 5e-6;       // seconds per message (alpha)
  double bandwidth = 10e9;     // bytes per second of each link (1 / beta)
  double reduceBandwidth = 0;  // bytes per second of a local reduction; 0: free
  double copyBandwidth = 0;    // bytes per second of a local copy; 0: free
  // Between two ranks of one host (SimOptions::localRanks), where set
  // (> 0): that link's latency and bandwidth instead, e.g. shm's within
  // hosts joined by tcp.
  double hostLatency = 0;
  double hostBandwidth = 0;
};

struct SimOptions {
  LinkModel link;
  size_t elemSize = 4;    // for the time estimate (the data check uses int64)
  bool checkData = true;  // false: sizes and time only, for large buffers
  size_t chunkBytes = size_t{1} << 20;
  size_t alignBytes = 64;
  // Every rank's buffers are mapped by the others (Shape::mapped): direct
  // steps read and write peers' buffers, each such byte costing the link's
  // time, and a Signal is an empty message.
  bool mapped = false;
  // Ranks per host, numbered host by host (Shape::localRanks); 0: unknown.
  int localRanks = 0;
};

struct SimResult {
  std::string problem;    // "" when every check passed
  double seconds = 0;     // when the last rank finished
  uint64_t messages = 0;  // sent by all ranks together
  uint64_t bytes = 0;     // sent by all ranks together
};

// Simulates `collective` run by `algorithm` on `nranks` ranks over `count`
// elements (per rank for all-gather and reduce-scatter), `root` for
// broadcast and reduce. REQUIRES: applies(collective, algorithm, shape).
SimResult simulate(Collective collective, Algorithm algorithm, int nranks, size_t count, int root,
                   const SimOptions& options);

}  // namespace braid::algo
