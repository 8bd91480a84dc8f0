#include <algorithm>
#include <cmath>
#include <cstring>

#include "optim/step.hpp"

namespace gpt::optim {

namespace {

// bf16 or int8 state: a quantization block at a time (bf16 has no blocks, but the same loop serves it).
template <class Rule>
void step_cpu_lowp(const StepArgs& a) {
  constexpr int K = Rule::kSlots, B = kQuantBlock;
  float* p = a.master ? a.master : static_cast<float*>(a.param);
  const float* g = static_cast<const float*>(a.grad);
  const Code* code[K];
  for (int k = 0; k < K; ++k) code[k] = &code_of(Rule::kSlotSigned[k]);
  const bool q8 = a.state == StateType::Int8;
  const size_t nb = quant_blocks(a.n);
  unsigned bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t blk = 0; blk < nb; ++blk) {
    const size_t i0 = blk * B, m = std::min<size_t>(B, a.n - i0);
    float s[K][B];
    for (int k = 0; k < K; ++k)
      for (size_t j = 0; j < m; ++j)
        s[k][j] = q8 ? decode(static_cast<const uint8_t*>(a.slot[k])[i0 + j], code[k]->value, a.scale[k][blk])
                     : bf16_value(static_cast<const uint16_t*>(a.slot[k])[i0 + j]);
    bool finite = true;
    for (size_t j = 0; j < m; ++j) {
      const size_t i = i0 + j;
      float sj[K];
      for (int k = 0; k < K; ++k) sj[k] = s[k][j];
      p[i] = Rule::template apply_as<Fused>(p[i], Fused::mul(g[i], a.grad_scale), sj, i < a.n_decay ? a.h : a.h_rest);
      finite = finite && std::isfinite(p[i]);
      for (int k = 0; k < K; ++k) {
        s[k][j] = sj[k];
        finite = finite && std::isfinite(sj[k]);
      }
    }
    bad |= unsigned(!finite);
    for (int k = 0; k < K; ++k) {
      if (q8) {
        a.scale[k][blk] = quantize_block(s[k], m, *code[k], Rule::kSlotSigned[k], static_cast<uint8_t*>(a.slot[k]) + i0);
      } else {
        uint16_t* h = static_cast<uint16_t*>(a.slot[k]) + i0;
        for (size_t j = 0; j < m; ++j) h[j] = bf16_round(s[k][j], state_random(a.seed, a.index_offset + i0 + j, k));
      }
    }
  }
  if (a.nonfinite && bad) *a.nonfinite = 1;
  if (a.master && a.param) std::memcpy(a.param, a.master, a.n * 4);
}

}  // namespace

// The CPU backend is fp32 throughout: no rounding of the parameters.
template <class Rule>
void step_cpu(const StepArgs& a) {
  if (a.state != StateType::F32) return step_cpu_lowp<Rule>(a);
  float* p = a.master ? a.master : static_cast<float*>(a.param);
  const float* g = static_cast<const float*>(a.grad);
  float* slot[Rule::kSlots];
  for (int k = 0; k < Rule::kSlots; ++k) slot[k] = static_cast<float*>(a.slot[k]);
  unsigned bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t i = 0; i < a.n; ++i) {
    float s[Rule::kSlots];
    for (int k = 0; k < Rule::kSlots; ++k) s[k] = slot[k][i];
    p[i] = Rule::apply(p[i], g[i] * a.grad_scale, s, a.h);
    bool finite = std::isfinite(p[i]);
    for (int k = 0; k < Rule::kSlots; ++k) {
      slot[k][i] = s[k];
      finite = finite && std::isfinite(s[k]);
    }
    bad |= unsigned(!finite);
  }
  if (a.nonfinite && bad) *a.nonfinite = 1;
  if (a.master && a.param) std::memcpy(a.param, a.master, a.n * 4);
}

#define GPT_INSTANTIATE(R) template void step_cpu<R>(const StepArgs&);
GPT_OPTIMIZER_RULES(GPT_INSTANTIATE)
#undef GPT_INSTANTIATE

}  // namespace gpt::optim
