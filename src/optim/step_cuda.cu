// The rules' CUDA kernel: one pass over param/master/grad/slots, vectorised as every elementwise kernel
// (kernels/common.cuh).
#include "kernels/common.cuh"
#include "optim/step.hpp"

namespace gpt::optim {

namespace {
using kern::bf16;

template <class X>
__device__ __forceinline__ X round_param(float w, size_t i, const StepArgs& a) {
  if constexpr (std::is_same_v<X, bf16>) {
    if (a.stochastic) return kern::sr_bf16(w, kern::hash_u32(a.seed ^ (a.index_offset + uint64_t(i))));
  }
  return kern::from_f<X>(w);
}

// The rule's element function in this instantiation. AdamW's fused multiply-adds take the forms the
// compiler had chosen for each instantiation of the kernel before the optimizer interface (rules.hpp),
// so that its results are bit-identical to earlier builds.
template <class Rule, class X, int V>
__device__ __forceinline__ float rule_apply(float w, float g, float* s, const Hyper& h) {
  if constexpr (std::is_same_v<Rule, AdamW>) {
    constexpr bool bf = std::is_same_v<X, bf16>;
    return AdamW::apply<!bf && V == 1, bf && V == 1>(w, g, s, h);
  } else {
    return Rule::apply(w, g, s, h);
  }
}

// The elements from e on, V of them; e is also the element's index in the range (for the rounding seed).
template <class Rule, class X>
struct StepOp {
  StepArgs a;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    const X* grad = static_cast<const X*>(a.grad);
    X* param = static_cast<X*>(a.param);
    const kern::Vec<X, V> g = kern::ldv<X, V>(grad + e);
    kern::Vec<float, V> s[Rule::kSlots];
#pragma unroll
    for (int k = 0; k < Rule::kSlots; ++k) s[k] = kern::ldv<float, V>(a.slot[k] + e);
    kern::Vec<float, V> w;
    if (a.master) {
      w = kern::ldv<float, V>(a.master + e);
    } else {
      const kern::Vec<X, V> p = kern::ldv<X, V>(param + e);
#pragma unroll
      for (int k = 0; k < V; ++k) w.v[k] = kern::to_f(p.v[k]);
    }
    kern::Vec<X, V> p;
    bool finite = true;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float sk[Rule::kSlots];
#pragma unroll
      for (int j = 0; j < Rule::kSlots; ++j) sk[j] = s[j].v[k];
      w.v[k] = rule_apply<Rule, X, V>(w.v[k], kern::to_f(g.v[k]) * a.grad_scale, sk, a.h);
      p.v[k] = round_param<X>(w.v[k], e + k, a);
      finite &= isfinite(w.v[k]);
#pragma unroll
      for (int j = 0; j < Rule::kSlots; ++j) {
        s[j].v[k] = sk[j];
        finite &= isfinite(sk[j]);
      }
    }
    if (!finite && a.nonfinite) atomicOr(a.nonfinite, 1u);
#pragma unroll
    for (int k = 0; k < Rule::kSlots; ++k) kern::stv<float, V>(a.slot[k] + e, s[k]);
    if (a.master) kern::stv<float, V>(a.master + e, w);
    if (a.param) kern::stv<X, V>(param + e, p);
  }
};

template <class Rule, class X>
void launch(const StepArgs& a, cudaStream_t s) {
  constexpr int V = 8;  // 16-byte bf16 accesses, two 16-byte fp32 ones
  bool vec = is_aligned(a.grad, V * sizeof(X)) && is_aligned(a.param, V * sizeof(X)) && is_aligned(a.master, 4 * V);
  for (int k = 0; k < Rule::kSlots; ++k) vec = vec && is_aligned(a.slot[k], 4 * V);
  kern::launch_elementwise_vec<V>(a.n, vec, StepOp<Rule, X>{a}, s);
}
}  // namespace

template <class Rule>
void step_cuda(const StepArgs& a, void* stream) {
  if (a.bf16) launch<Rule, bf16>(a, static_cast<cudaStream_t>(stream));
  else launch<Rule, float>(a, static_cast<cudaStream_t>(stream));
}

#define GPT_INSTANTIATE(R) template void step_cuda<R>(const StepArgs&, void*);
GPT_OPTIMIZER_RULES(GPT_INSTANTIATE)
#undef GPT_INSTANTIATE

}  // namespace gpt::optim
