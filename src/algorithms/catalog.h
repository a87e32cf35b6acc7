// Every algorithm braid has, by collective: names for BRAID_ALGO and the
// tools, which algorithm can run which collective at which shape, and the
// one entry point that makes a plan.
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

enum class Algorithm : uint8_t {
  Ring,               // all-reduce, all-gather, reduce-scatter
  OneShot,            // all-reduce
  RecursiveDoubling,  // all-reduce
  Rabenseifner,       // all-reduce
  Tree,               // all-reduce (double binary tree)
  Chain,              // broadcast, reduce
  Binomial,           // broadcast, reduce
  ScatterAllGather,   // broadcast
  Bruck,              // all-gather
  RecursiveHalving,   // reduce-scatter
  Direct,             // send, recv
  TwoShot,            // all-reduce on mapped buffers
  Hierarchical,       // all-reduce, broadcast, all-gather, reduce-scatter across hosts
};

// "allreduce", "broadcast", ... and back; false for an unknown name.
const char* collectiveName(Collective collective);
bool parseCollective(const std::string& name, Collective* collective);
// "ring", "oneshot", "recdoubling", "rabenseifner", "tree", "chain",
// "binomial", "scatter", "bruck", "rechalving", "direct", "twoshot",
// "hier" and back.
const char* algorithmName(Algorithm algorithm);
bool parseAlgorithm(const std::string& name, Algorithm* algorithm);

// The algorithms that can run `collective`, in a fixed order.
const std::vector<Algorithm>& algorithmsFor(Collective collective);

// Whether `algorithm` can run `collective` at `shape` (recursive halving
// needs a power-of-two rank count; one-shot all-reduce a buffer that fits
// the scratch area, or mapped buffers; two-shot, one-shot all-gather and
// one-shot broadcast mapped buffers; the hierarchical ones ranks numbered
// host by host, at least two on each of at least two hosts).
bool applies(Collective collective, Algorithm algorithm, const Shape& shape);

// The bytes of the call's whole buffer, as braid-perf counts sizes: the
// gathered one for all-gather and reduce-scatter.
size_t bufferBytes(Collective collective, const Shape& shape);

// The plan. REQUIRES: applies(collective, algorithm, shape).
Plan makePlan(Collective collective, Algorithm algorithm, const Shape& shape);

}  // namespace braid::algo
