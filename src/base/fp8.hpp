// FP8 encoding on the host: what the CPU backend emulates FP8 training with, and what the GPU kernels
// (__nv_cvt_float_to_fp8 with saturation to the largest finite value) are tested against.
#pragma once
#include <cstdint>

#include "base/fp8_math.hpp"

namespace gpt {

using Fp8Format = fp8::Format;

// Round x to the nearest value of the format, ties to an even mantissa; beyond the largest finite
// value (infinities too) saturate to it with x's sign; NaN gives 0x7f.
uint8_t fp8_encode(float x, Fp8Format f);
float fp8_decode(uint8_t q, Fp8Format f);
const char* fp8_format_name(Fp8Format f);  // "e4m3" or "e5m2"

}  // namespace gpt
