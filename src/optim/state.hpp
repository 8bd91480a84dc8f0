// How the optimizer's state slots are held (training.optimizer_state), for host and device alike: the CPU
// loop (step_cpu.cpp) and the CUDA kernel (step_cuda.cu) run these functions on the same values in the same
// order, so both write the same bytes.
//   fp32  one float per value (the rules' own slots, unchanged)
//   bf16  the upper half of the float, rounded stochastically: 16 random bits from hash_u32(seed ^ logical
//         index ^ slot tag) added below the kept bits, then truncated (the parameters' scheme, another
//         stream per slot), so a moment that decays by less than half a bf16 step still decays on average
//   int8  blocks of kQuantBlock consecutive values (from the start of each bucket, so a block never spans
//         two ranks' pieces) with one fp32 scale each, the block's absolute maximum; each value the index of
//         the nearest of 256 code values (times the scale). The codes are logarithmic: a signed code (first
//         moments: 0, +-1 and 126 magnitudes below each in steps of 10^(-5/126) down to 1e-5) and an unsigned
//         one (second moments: 0 and 255 values from 1 down to 1e-10 in steps of 10^(-10/254)); a positive
//         value never becomes 0 in the unsigned code (the smallest step instead), so AdamW never divides by
//         a second moment rounded to nothing. docs/DESIGN.md (The optimizer) has the measurements behind them.
// A step dequantizes a block (code value * scale, one rounding), runs the rule on every element in fp32
// with the Fused arithmetic (rules.hpp), takes the new block maximum (exact in any order), multiplies each
// value by the reciprocal 1/max (IEEE division, the same on both) and finds its code by comparisons with
// the midpoints between neighbouring code values.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "optim/rules.hpp"

namespace gpt::optim {

enum class StateType : uint8_t { F32, BF16, Int8 };
// What bf16 parameters are updated from (training.master_weights): nothing but themselves, an fp32 copy,
// or a bf16 residual beside them (compensated_split below). fp32 parameters never have a copy.
enum class MasterKind : uint8_t { None, F32, Compensated };
inline size_t master_bytes_per_value(MasterKind m) { return m == MasterKind::F32 ? 4 : m == MasterKind::Compensated ? 2 : 0; }
inline const char* state_type_name(StateType t) {
  return t == StateType::F32 ? "fp32" : t == StateType::BF16 ? "bf16" : "int8";
}
// bytes a value takes (int8: without its block's scale)
inline size_t state_type_size(StateType t) { return t == StateType::F32 ? 4 : t == StateType::BF16 ? 2 : 1; }
// training.optimizer_state's text; false when it names none
inline bool parse_state_type(const std::string& s, StateType& out) {
  for (StateType t : {StateType::F32, StateType::BF16, StateType::Int8})
    if (s == state_type_name(t)) {
      out = t;
      return true;
    }
  return false;
}

constexpr int kQuantBlock = 256;  // values per int8 scale
inline size_t quant_blocks(size_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }
// bytes of n values' state of type t (int8: codes and the scales of their blocks)
inline size_t state_bytes(StateType t, size_t n) {
  return t == StateType::Int8 ? n + 4 * quant_blocks(n) : state_type_size(t) * n;
}

// The 256 values of an int8 code, ascending, and the 255 midpoints between neighbours: a value's code is
// the number of midpoints below it (a value on a midpoint takes the lower code).
struct Code {
  float value[256];
  float mid[255];
};
// Logarithmic codes from a float ratio r applied repeatedly (float products, exact to reproduce): the
// signed one is -1, -r, ..., -r^126, 0, r^126, ..., r, 1, 1 (its last code repeats 1: nothing rounds to it
// but a value past the block maximum by a rounding); the unsigned one 0, r^254, ..., r, 1.
inline Code make_code(bool is_signed) {
  Code c{};
  const float r = is_signed ? 0x1.d34a8p-1f : 0x1.d3a098p-1f;  // 1e-5^(1/126), 1e-10^(1/254) in float
  const int n = is_signed ? 127 : 255;                         // magnitudes
  float mag[255];
  mag[0] = 1.0f;
  for (int j = 1; j < n; ++j) mag[j] = mag[j - 1] * r;  // descending
  int at = 0;
  if (is_signed) {
    for (int j = 0; j < n; ++j) c.value[at++] = -mag[j];
    c.value[at++] = 0.0f;
    for (int j = n - 1; j >= 0; --j) c.value[at++] = mag[j];
    c.value[at++] = 1.0f;
  } else {
    c.value[at++] = 0.0f;
    for (int j = n - 1; j >= 0; --j) c.value[at++] = mag[j];
  }
  for (int i = 0; i < 255; ++i) c.mid[i] = (c.value[i] + c.value[i + 1]) * 0.5f;
  return c;
}
inline const Code& code_of(bool is_signed) {
  static const Code s = make_code(true), u = make_code(false);
  return is_signed ? s : u;
}
// The name a checkpoint gives the code (its datasets' `code` attribute): "signed" or "unsigned".
inline const char* code_name(const Code& c) { return &c == &code_of(true) ? "signed" : "unsigned"; }

// The code of x (already divided by the block's scale) among the values whose midpoints are mid: a
// branchless binary search, the same comparisons everywhere. Unsigned codes keep a positive x off 0.
GPT_RULE_HD uint8_t encode(float x, const float* mid, bool is_signed) {
  int c = 0;
  for (int step = 128; step > 0; step >>= 1) c += step * int(mid[c + step - 1] < x);  // no branch to mispredict
  if (!is_signed && c == 0 && x > 0.0f) c = 1;
  return uint8_t(c);
}
GPT_RULE_HD float decode(uint8_t code, const float* value, float scale) { return Fused::mul(value[code], scale); }
// 1 / a block's maximum (0 for an all-zero block, whose codes are then all zero's)
GPT_RULE_HD float inverse_scale(float amax) { return amax > 0.0f ? 1.0f / amax : 0.0f; }

// A block of m <= kQuantBlock values on the host: their codes into c; returns the block's scale. (The CUDA
// kernel computes the same per element, the maximum by a block-wide reduction.)
inline float quantize_block(const float* x, size_t m, const Code& code, bool is_signed, uint8_t* c) {
  float amax = 0.0f;
  for (size_t j = 0; j < m; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float inv = inverse_scale(amax);
  for (size_t j = 0; j < m; ++j) c[j] = encode(Fused::mul(x[j], inv), code.mid, is_signed);
  return amax;
}

// The parameters' random stream (kernels/common.cuh's hash_u32: splitmix64's finaliser) and stochastic
// rounding to bf16 as bits, written once for both sides.
GPT_RULE_HD uint32_t state_hash(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return uint32_t(x);
}
// The random bits of slot k's value at logical index i in the step of `seed`.
GPT_RULE_HD uint32_t state_random(uint64_t seed, uint64_t i, int k) {
  return state_hash(seed ^ i ^ (uint64_t(k + 1) << 48));
}
GPT_RULE_HD uint16_t bf16_bits_sr(uint32_t bits, uint32_t rnd) {
  if ((bits & 0x7f800000u) == 0x7f800000u) return uint16_t(bits >> 16);  // inf and NaN as they are
  return uint16_t(((bits + (rnd & 0xffffu)) & 0xffff0000u) >> 16);
}
GPT_RULE_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
GPT_RULE_HD float f32_of_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
GPT_RULE_HD float bf16_value(uint16_t h) { return f32_of_bits(uint32_t(h) << 16); }
GPT_RULE_HD uint16_t bf16_round(float x, uint32_t rnd) { return bf16_bits_sr(f32_bits(x), rnd); }

// Compensated master weights (training.master_weights: compensated): the fp32 master value w is kept as
// two bf16 numbers, the parameter hi = w rounded to nearest (even on a tie) and the residual lo = w - hi
// (exact in fp32) truncated to bf16, so w ~ hi + lo to about 16 significant bits (fp32 has 24). hi + lo
// is exact in fp32, and truncation keeps |lo| below half a step of hi (rounding could reach it and make
// hi + lo a tie), so split(hi + lo) gives back hi and lo: a checkpoint of the sum restores both bit for bit.
GPT_RULE_HD uint16_t bf16_bits_rn(uint32_t bits) {
  if ((bits & 0x7f800000u) == 0x7f800000u) return uint16_t((bits >> 16) | ((bits & 0xffffu) ? 0x40u : 0u));  // NaN stays NaN
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
struct Compensated {
  uint16_t hi, lo;
};
GPT_RULE_HD Compensated compensated_split(float w) {
  const uint16_t hi = bf16_bits_rn(f32_bits(w));
  const float rest = w - bf16_value(hi);  // exact (Sterbenz); inf - inf is NaN, which the step reports
  return {hi, uint16_t(f32_bits(rest) >> 16)};
}
GPT_RULE_HD float compensated_value(uint16_t hi, uint16_t lo) { return bf16_value(hi) + bf16_value(lo); }

}  // namespace gpt::optim
