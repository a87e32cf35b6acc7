// Inputs and independently computed expected results for collective tests.
//
// Every element of every rank's input is a pure function of (seed, rank,
// index), chosen exactly representable in its type and in a range where the
// op's result stays finite. Expected values are computed in double (floats)
// or in modular 64-bit arithmetic (integers) from the decoded inputs.
// Integers must match exactly; floats within the forward-error bound of
// recursive summation/multiplication: gamma(n+1) * sum|x_i| (Sum, Avg) or
// gamma(n+1) * |result| (Prod), gamma(k) = (1+u)^k - 1 with u the type's unit
// roundoff, plus (n+1) times its smallest subnormal. Max and Min are exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "braid/types.h"

namespace braid::testing {

// The input of `rank` at global element `index`.
double inputValue(DataType type, ReduceOp op, uint64_t seed, int rank, size_t index);

// Writes `count` input elements of `rank`, global indices first..first+count,
// into `buffer` (typed storage).
void fillInput(DataType type, ReduceOp op, uint64_t seed, int rank, size_t first, size_t count,
               void* buffer);

// A typed buffer of `count` elements filled with a byte pattern that no
// correct result has by accident.
std::vector<std::byte> poisoned(DataType type, size_t count);

// Checks `count` elements of `got` (global indices first..) against the
// reduction over ranks 0..nranks-1 of their inputs. Returns "" or a message
// naming the first wrong element.
std::string checkReduced(DataType type, ReduceOp op, uint64_t seed, int nranks, size_t first,
                         size_t count, const void* got);

// Checks `count` elements of `got` against `rank`'s input (global indices
// first..): for broadcast and all-gather.
std::string checkCopied(DataType type, ReduceOp op, uint64_t seed, int rank, size_t first,
                        size_t count, const void* got);

}  // namespace braid::testing
