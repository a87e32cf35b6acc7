// The planners: one per file, each a pure function of the shape that gives
// one rank's steps. Each file's header comment gives its schedule and its
// bytes per rank; catalog.cc lists them with the collectives they run and
// the shapes they need (a planner's REQUIRES).
#pragma once

#include "algorithms/plan.h"

namespace braid::algo {

// All-reduce.
Plan ringAllReduce(const Shape& shape);               // ring_all_reduce.cc
Plan treeAllReduce(const Shape& shape);               // tree_all_reduce.cc
Plan rabenseifnerAllReduce(const Shape& shape);       // rabenseifner_all_reduce.cc
Plan recursiveDoublingAllReduce(const Shape& shape);  // recursive_doubling_all_reduce.cc
Plan oneShotAllReduce(const Shape& shape);            // one_shot_all_reduce.cc
Plan oneShotMappedAllReduce(const Shape& shape);      // direct.cc
Plan twoShotAllReduce(const Shape& shape);            // direct.cc
Plan hierarchicalAllReduce(const Shape& shape);       // hierarchical_all_reduce.cc

// Broadcast.
Plan chainBroadcast(const Shape& shape);             // chain_broadcast.cc
Plan binomialBroadcast(const Shape& shape);          // binomial_broadcast.cc
Plan scatterAllGatherBroadcast(const Shape& shape);  // scatter_all_gather_broadcast.cc
Plan oneShotBroadcast(const Shape& shape);           // direct.cc
Plan hierarchicalBroadcast(const Shape& shape);      // hierarchical_broadcast.cc

// Reduce.
Plan chainReduce(const Shape& shape);     // chain_reduce.cc
Plan binomialReduce(const Shape& shape);  // binomial_reduce.cc

// All-gather.
Plan ringAllGather(const Shape& shape);          // ring_all_gather.cc
Plan bruckAllGather(const Shape& shape);         // bruck_all_gather.cc
Plan oneShotAllGather(const Shape& shape);       // direct.cc
Plan hierarchicalAllGather(const Shape& shape);  // hierarchical_all_gather.cc

// Reduce-scatter.
Plan ringReduceScatter(const Shape& shape);              // ring_reduce_scatter.cc
Plan recursiveHalvingReduceScatter(const Shape& shape);  // recursive_halving_reduce_scatter.cc
Plan hierarchicalReduceScatter(const Shape& shape);      // hierarchical_reduce_scatter.cc

// Point-to-point.
Plan sendTo(const Shape& shape);    // point_to_point.cc
Plan recvFrom(const Shape& shape);  // point_to_point.cc

}  // namespace braid::algo
