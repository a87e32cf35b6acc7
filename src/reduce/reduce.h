// Host reduction kernels: dst[i] = a[i] op b[i] for every DataType x ReduceOp.
//
// fp16, bf16 and fp8 operands are widened to fp32, combined, and rounded back
// to nearest even. fp8 conversions saturate to the largest finite value (E4M3
// has no infinity; E5M2 keeps an infinite input infinite). Integer Sum and
// Prod wrap modulo 2^bits; floating-point Max/Min propagate NaN and order -0
// below +0 (IEEE 754-2019 maximum/minimum), so only which NaN comes back can
// depend on operand order. The narrow-float conversions ignore the dynamic
// rounding mode.
//
// The kernels exist at several ISA levels (portable, AVX2, AVX-512; see
// dispatch.h) that give bit-identical results (a NaN from Sum or Prod of two
// NaNs may carry either one's payload); kernelFor() hands out the widest one
// this CPU supports, chosen once, at the first call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/types.h"

namespace braid::reduce {

// dst = a op b, elementwise over `count` elements. dst may alias a or b
// (exactly, not partially). Avg combines like Sum; finalize() divides.
using Kernel = void (*)(void* dst, const void* a, const void* b, size_t count);

// The kernel for (type, op), from the table of the widest supported ISA
// level. REQUIRES: isValid(type) && isValid(op) (an out-of-range value gets
// nullptr).
Kernel kernelFor(DataType type, ReduceOp op);

// The last step of a reduction: for Avg, dst[i] = dst[i] / divisor
// (integers truncate toward zero; narrow floats divide in fp32 and round
// once); for every other op, nothing. REQUIRES: divisor >= 1 (a smaller one
// leaves dst unchanged rather than dividing by zero).
void finalize(void* dst, size_t count, DataType type, ReduceOp op, int divisor);

// Conversions for the narrow floating-point types (round to nearest even).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float fp8e4m3ToFloat(uint8_t v);
uint8_t floatToFp8e4m3(float f);
float fp8e5m2ToFloat(uint8_t v);
uint8_t floatToFp8e5m2(float f);

}  // namespace braid::reduce
