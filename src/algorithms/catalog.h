// Every algorithm braid has, as one table (catalog.cc): a row per
// collective an algorithm runs, with its name for BRAID_ALGO and the tools,
// what it does and costs, when it applies, and its planner. Everything else
// here is read off that table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.h"

namespace braid::algo {

enum class Collective : uint8_t {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  Send,
  Recv
};

// Which collectives each one runs: the catalog's rows.
enum class Algorithm : uint8_t {
  Ring,
  OneShot,
  RecursiveDoubling,
  Rabenseifner,
  Tree,
  Chain,
  Binomial,
  ScatterAllGather,
  Bruck,
  RecursiveHalving,
  Direct,
  TwoShot,
  Hierarchical,
};

// When an algorithm applies, beyond the collective: a test of the shape
// and the same in words for people.
struct Rule {
  const char* text;  // "" where it applies at every shape
  bool (*holds)(const Shape& shape);
};

// One row of the catalog: `algorithm` running `collective`.
struct AlgorithmInfo {
  Collective collective;
  Algorithm algorithm;
  const char* name;                  // BRAID_ALGO's and the tools' name; one per algorithm
  const char* description;           // its schedule and cost, in one line (S: see below)
  Rule rule;                         // the shapes it applies at
  Plan (*plan)(const Shape& shape);  // the planner; REQUIRES: rule.holds(shape)
};

// Every row, collective by collective, each collective's algorithms in
// algorithmsFor's order. In the descriptions S is the bytes of a rank's
// buffer: its input block for all-gather, its output block for
// reduce-scatter; n ranks, L on each of H hosts.
const std::vector<AlgorithmInfo>& catalog();

// "allreduce", "broadcast", ... and back; false for an unknown name.
const char* collectiveName(Collective collective);
bool parseCollective(const std::string& name, Collective* collective);

// The algorithm's name in the catalog ("ring", "tree", ...) and back
// (exact spelling); "invalid" and false for what the catalog lacks.
const char* algorithmName(Algorithm algorithm);
bool parseAlgorithm(const std::string& name, Algorithm* algorithm);

// The algorithms that can run `collective`, in the catalog's order (the
// tuner breaks ties by it; the first one applies at every shape).
const std::vector<Algorithm>& algorithmsFor(Collective collective);

// Their names, joined by `separator`: "ring, tree, rabenseifner, ...".
std::string algorithmNames(Collective collective, const char* separator = ", ");

// Whether `algorithm` can run `collective` at `shape`: it has a row whose
// rule holds.
bool applies(Collective collective, Algorithm algorithm, const Shape& shape);

// The bytes of the call's whole buffer, as braid-perf counts sizes: the
// gathered one for all-gather and reduce-scatter.
size_t bufferBytes(Collective collective, const Shape& shape);

// The plan, from the row's planner. REQUIRES: applies(collective,
// algorithm, shape).
Plan makePlan(Collective collective, Algorithm algorithm, const Shape& shape);

}  // namespace braid::algo
