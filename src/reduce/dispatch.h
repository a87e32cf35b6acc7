// Which instruction-set level the reduction kernels use, chosen once per
// process from what the CPU supports. Internal to braid: reduce.h's
// kernelFor(type, op) is what the rest of braid calls; this header lets
// tests and benchmarks name a level.
//
// Levels, each a complete set of kernels with bit-identical results:
//   Scalar  portable C++ (the compiler may still use the baseline SSE2)
//   Avx2    AVX2 + F16C
//   Avx512  AVX-512 F, BW and VL (+ F16C)
#pragma once

#include "reduce/reduce.h"

namespace braid::reduce {

enum class Isa { Scalar, Avx2, Avx512 };
inline constexpr int kNumIsas = 3;

// "scalar", "avx2", "avx512"; "invalid" for an out-of-range value.
const char* isaName(Isa isa);

// Whether this CPU and OS can run the level's kernels. Scalar always can.
bool isaSupported(Isa isa);

// The widest supported level: the one kernelFor(type, op) uses.
Isa bestIsa();

// The kernel of one level for (type, op); nullptr if the type, op or level
// is out of range or the level is not supported here.
Kernel kernelFor(DataType type, ReduceOp op, Isa isa);

}  // namespace braid::reduce
