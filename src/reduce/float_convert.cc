// The out-of-line narrow-float conversions declared in reduce.h; the bit
// manipulation itself lives in float_convert.h, shared with the kernels.
#include "reduce/float_convert.h"

#include "reduce/reduce.h"

namespace braid::reduce {

float halfToFloat(uint16_t h) { return detail::halfToFloatInline(h); }
uint16_t floatToHalf(float f) { return detail::floatToHalfInline(f); }
float bf16ToFloat(uint16_t h) { return detail::bf16ToFloatInline(h); }
uint16_t floatToBf16(float f) { return detail::floatToBf16Inline(f); }
float fp8e4m3ToFloat(uint8_t v) { return detail::fp8e4m3ToFloatInline(v); }
uint8_t floatToFp8e4m3(float f) { return detail::floatToFp8e4m3Inline(f); }
float fp8e5m2ToFloat(uint8_t v) { return detail::fp8e5m2ToFloatInline(v); }
uint8_t floatToFp8e5m2(float f) { return detail::floatToFp8e5m2Inline(f); }

}  // namespace braid::reduce
