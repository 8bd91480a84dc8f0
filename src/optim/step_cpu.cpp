#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "optim/step.hpp"

namespace gpt::optim {

namespace {

// bf16 or int8 state: the loop that runs the kernel's blocks on the host (below), which on fp32
// parameters (the CPU backend) writes the master and the parameter alike.
template <class Rule>
void step_host_lowp(const StepArgs& a);

}  // namespace

// The CPU backend is fp32 throughout: no rounding of the parameters.
template <class Rule>
void step_cpu(const StepArgs& a) {
  if (a.state != StateType::F32) return step_host_lowp<Rule>(a);
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

// ---- training.offload: the CUDA kernel's update on the host (step_cuda.cu, element for element)
namespace {

// The device's conversions to bf16, as bits: __float2bfloat16_rn (a NaN becomes the canonical 0x7fff)
// and kern::sr_bf16 (inf and NaN converted to nearest, the rest as bf16_bits_sr).
uint16_t device_bf16_rn(float x) { return std::isnan(x) ? uint16_t(0x7fff) : bf16_bits_rn(f32_bits(x)); }
uint16_t device_bf16_sr(float x, uint32_t rnd) {
  const uint32_t u = f32_bits(x);
  return (u & 0x7f800000u) == 0x7f800000u ? device_bf16_rn(x) : bf16_bits_sr(u, rnd);
}

// Element i's parameter (param, grad and residual as the kernel reads them) and its write-back.
float host_param(const StepArgs& a, size_t i) {
  const float p = a.bf16 ? bf16_value(static_cast<const uint16_t*>(a.param)[i]) : static_cast<const float*>(a.param)[i];
  return a.residual ? p + bf16_value(a.residual[i]) : p;
}
float host_grad(const StepArgs& a, size_t i) {
  return a.bf16 ? bf16_value(static_cast<const uint16_t*>(a.grad)[i]) : static_cast<const float*>(a.grad)[i];
}
float host_w(const StepArgs& a, size_t i) { return a.master ? a.master[i] : host_param(a, i); }
// write_param and the stores after it
void host_store(const StepArgs& a, size_t i, float w) {
  if (a.master) a.master[i] = w;
  if (!a.param) return;
  if (!a.bf16) {
    static_cast<float*>(a.param)[i] = w;
    return;
  }
  uint16_t& p = static_cast<uint16_t*>(a.param)[i];
  if (a.residual) {
    const Compensated c = compensated_split(w);
    p = c.hi;
    a.residual[i] = c.lo;
  } else {
    p = a.stochastic ? device_bf16_sr(w, state_hash(a.seed ^ (a.index_offset + uint64_t(i)))) : device_bf16_rn(w);
  }
}

// The kernel's rule_apply with its products and fused multiply-adds (Compiled on the device: __fmul_rn,
// __fmaf_rn, and nvcc's contraction of w - lr (q + wd w) into two fused multiply-adds) as the Fused
// arithmetic computes them on the host.
template <class Rule, bool OneElement>
float host_rule(float w, float g, float* s, const Hyper& h, bool bf16) {
  if constexpr (std::is_same_v<Rule, AdamW>) {
    return bf16 ? AdamW::apply<false, OneElement, Fused>(w, g, s, h) : AdamW::apply<OneElement, false, Fused>(w, g, s, h);
  } else {
    return Rule::template apply_as<Fused>(w, g, s, h);
  }
}

template <class Rule>
void step_host_f32(const StepArgs& a, bool aligned) {
  constexpr int K = Rule::kSlots;
  const size_t bulk = aligned ? a.n / kStepVec * kStepVec : 0;
  unsigned bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t i = 0; i < a.n; ++i) {
    float s[K];
    for (int k = 0; k < K; ++k) s[k] = static_cast<const float*>(a.slot[k])[i];
    const float g = host_grad(a, i) * a.grad_scale;
    float w = host_w(a, i);
    w = i < bulk ? host_rule<Rule, false>(w, g, s, a.h, a.bf16) : host_rule<Rule, true>(w, g, s, a.h, a.bf16);
    host_store(a, i, w);
    bool finite = std::isfinite(w);
    for (int k = 0; k < K; ++k) {
      static_cast<float*>(a.slot[k])[i] = s[k];
      finite = finite && std::isfinite(s[k]);
    }
    bad |= unsigned(!finite);
  }
  if (a.nonfinite && bad) *a.nonfinite = 1;
}

// lowp_kernel: a quantization block at a time
template <class Rule>
void step_host_lowp(const StepArgs& a) {
  constexpr int K = Rule::kSlots, B = kQuantBlock;
  const Code* code[K];
  for (int k = 0; k < K; ++k) code[k] = &code_of(Rule::kSlotSigned[k]);
  const bool q8 = a.state == StateType::Int8;
  const size_t nb = quant_blocks(a.n);
  unsigned bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t blk = 0; blk < nb; ++blk) {
    const size_t i0 = blk * B, m = std::min<size_t>(B, a.n - i0);
    float s[K][B];
    bool finite = true;
    for (size_t j = 0; j < m; ++j) {
      const size_t i = i0 + j;
      float sj[K];
      for (int k = 0; k < K; ++k)
        sj[k] = q8 ? decode(static_cast<const uint8_t*>(a.slot[k])[i], code[k]->value, a.scale[k][blk])
                   : bf16_value(static_cast<const uint16_t*>(a.slot[k])[i]);
      const float w = Rule::template apply_as<Fused>(host_w(a, i), Fused::mul(host_grad(a, i), a.grad_scale), sj,
                                                     i < a.n_decay ? a.h : a.h_rest);
      host_store(a, i, w);
      finite = finite && std::isfinite(w);
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
}

}  // namespace

template <class Rule>
void step_host(const StepArgs& a, bool aligned) {
  if (a.state != StateType::F32) step_host_lowp<Rule>(a);
  else step_host_f32<Rule>(a, aligned);
}

#define GPT_INSTANTIATE(R) \
  template void step_cpu<R>(const StepArgs&); \
  template void step_host<R>(const StepArgs&, bool);
GPT_OPTIMIZER_RULES(GPT_INSTANTIATE)
#undef GPT_INSTANTIATE

}  // namespace gpt::optim
