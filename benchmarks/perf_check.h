// braid-perf's correctness check: inputs whose results are exact in every
// data type, written in the type's own bit pattern, and a reference result
// computed independently of the library.
//
// Every input is a small integer (or a power of two, for prod) chosen so that
// every partial result, in whatever order the ranks combine them, is an
// integer the type represents exactly: sums stay within the type's run of
// exact integers (16 for fp8e4m3, 8 for fp8e5m2, 256 for bfloat16, ...),
// products within its powers of two, and the inputs of avg are multiples of
// the rank count. So results are compared exactly, never with a tolerance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "benchmarks/perf_options.h"
#include "braid/types.h"

namespace braid::perf {

// Element `index` of a buffer of `type`, as a double. storeValue REQUIRES a
// value the type represents exactly (it throws std::logic_error otherwise).
void storeValue(DataType type, void* buffer, size_t index, double value);
double loadValue(DataType type, const void* buffer, size_t index);

// What rank `rank` contributes at (global) element `index`, and the result of
// reducing every rank's contribution.
class Pattern {
 public:
  // `reduces` false: inputs for a collective without an operator (op unused).
  Pattern(DataType type, ReduceOp op, bool reduces, int nranks);

  double input(int rank, size_t index) const;
  double reduced(size_t index) const;

 private:
  // A value in [0, k] where the sum over all ranks stays <= budget.
  double budgeted(int rank, size_t index, double budget) const;

  DataType type_;
  ReduceOp op_;
  bool reduces_;
  int nranks_;
  double sumLimit_;  // every integer in [0, sumLimit_] is exact in type_ and not the poison
  int maxTwos_;      // 2^maxTwos_ is exact in type_
  bool signed_;
};

// One checked run: where its buffers are and what it computes.
struct CheckCase {
  Collective collective;
  DataType type;
  ReduceOp op;
  int root;
  size_t count;  // elements per rank, as passed to the call
  int rank;
  int nranks;
  bool inPlace;
  // The buffers the call is given (in place, these overlap as NCCL says).
  void* send;
  void* recv;
};

// Writes the inputs of `c` and fills its outputs with a poison value that no
// correct result has.
void prepareCheck(const CheckCase& c);
// Elements of this rank's output that differ from the reference.
uint64_t countWrong(const CheckCase& c);

}  // namespace braid::perf
