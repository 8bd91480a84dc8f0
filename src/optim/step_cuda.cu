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
// The parameter written from its updated master value w: with compensated master weights (bf16 only)
// the nearest bf16 and the residual into `res` (optim/state.hpp), else rounded as round_param says.
template <class X>
__device__ __forceinline__ X write_param(float w, size_t i, const StepArgs& a, uint16_t& res) {
  if constexpr (std::is_same_v<X, bf16>) {
    if (a.residual) {
      const Compensated c = compensated_split(w);
      res = c.lo;
      return __ushort_as_bfloat16(c.hi);
    }
  }
  return round_param<X>(w, i, a);
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
    for (int k = 0; k < Rule::kSlots; ++k) s[k] = kern::ldv<float, V>(static_cast<float*>(a.slot[k]) + e);
    kern::Vec<float, V> w;
    kern::Vec<uint16_t, V> res{};
    if (a.master) {
      w = kern::ldv<float, V>(a.master + e);
    } else {
      const kern::Vec<X, V> p = kern::ldv<X, V>(param + e);
      if (a.residual) res = kern::ldv<uint16_t, V>(a.residual + e);
#pragma unroll
      for (int k = 0; k < V; ++k) w.v[k] = a.residual ? kern::to_f(p.v[k]) + bf16_value(res.v[k]) : kern::to_f(p.v[k]);
    }
    kern::Vec<X, V> p;
    bool finite = true;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float sk[Rule::kSlots];
#pragma unroll
      for (int j = 0; j < Rule::kSlots; ++j) sk[j] = s[j].v[k];
      w.v[k] = rule_apply<Rule, X, V>(w.v[k], kern::to_f(g.v[k]) * a.grad_scale, sk, a.h);
      p.v[k] = write_param<X>(w.v[k], e + k, a, res.v[k]);
      finite &= isfinite(w.v[k]);
#pragma unroll
      for (int j = 0; j < Rule::kSlots; ++j) {
        s[j].v[k] = sk[j];
        finite &= isfinite(sk[j]);
      }
    }
    if (!finite && a.nonfinite) atomicOr(a.nonfinite, 1u);
#pragma unroll
    for (int k = 0; k < Rule::kSlots; ++k) kern::stv<float, V>(static_cast<float*>(a.slot[k]) + e, s[k]);
    if (a.master) kern::stv<float, V>(a.master + e, w);
    if (a.residual) kern::stv<uint16_t, V>(a.residual + e, res);
    if (a.param) kern::stv<X, V>(param + e, p);
  }
};

// bf16 and int8 state: one thread block per quantization block, one thread per element (optim/state.hpp
// has the math, shared with the CPU loop). The int8 codes are the host's tables (code_of), copied once.
__device__ Code d_codes[2];  // signed, unsigned

__device__ __forceinline__ float block_max(float x, float* red) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int w = threadIdx.x / 32;
  __syncthreads();  // red's previous use is over
  if (threadIdx.x % 32 == 0) red[w] = x;
  __syncthreads();
  float m = red[0];
  for (int i = 1; i < kQuantBlock / 32; ++i) m = fmaxf(m, red[i]);
  return m;
}

template <class Rule, class X, bool Q8>
__global__ void __launch_bounds__(kQuantBlock) lowp_kernel(const StepArgs a) {
  constexpr int K = Rule::kSlots;
  __shared__ float value[K][256], mid[K][256], red[kQuantBlock / 32];
  const int t = threadIdx.x;
  if constexpr (Q8) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const Code& c = d_codes[a.slot_signed[k] ? 0 : 1];
      value[k][t] = c.value[t];
      if (t < 255) mid[k][t] = c.mid[t];
    }
    __syncthreads();
  }
  const size_t blk = blockIdx.x, i = blk * kQuantBlock + size_t(t);
  const bool in = i < a.n;
  float s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    s[k] = 0.0f;
    if (in) {
      if constexpr (Q8) s[k] = decode(static_cast<const uint8_t*>(a.slot[k])[i], value[k], a.scale[k][blk]);
      else s[k] = bf16_value(static_cast<const uint16_t*>(a.slot[k])[i]);
    }
  }
  bool finite = true;
  if (in) {
    const X* grad = static_cast<const X*>(a.grad);
    X* param = static_cast<X*>(a.param);
    float w = a.master     ? a.master[i]
              : a.residual ? kern::to_f(param[i]) + bf16_value(a.residual[i])
                           : kern::to_f(param[i]);
    w = Rule::template apply_as<Fused>(w, Fused::mul(kern::to_f(grad[i]), a.grad_scale), s,
                                       i < a.n_decay ? a.h : a.h_rest);
    if (a.master) a.master[i] = w;
    uint16_t res = 0;
    if (param) param[i] = write_param<X>(w, i, a, res);
    if (a.residual) a.residual[i] = res;
    finite = isfinite(w);
#pragma unroll
    for (int k = 0; k < K; ++k) finite &= isfinite(s[k]);
  }
  if (!finite && a.nonfinite) atomicOr(a.nonfinite, 1u);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if constexpr (Q8) {
      const float amax = block_max(in ? fabsf(s[k]) : 0.0f, red);
      const float inv = inverse_scale(amax);
      if (in) static_cast<uint8_t*>(a.slot[k])[i] = encode(Fused::mul(s[k], inv), mid[k], a.slot_signed[k]);
      if (t == 0) a.scale[k][blk] = amax;
    } else if (in) {
      static_cast<uint16_t*>(a.slot[k])[i] = bf16_round(s[k], state_random(a.seed, a.index_offset + i, k));
    }
  }
}

template <class Rule, class X>
void launch_lowp(const StepArgs& a, cudaStream_t s) {
  static bool codes_copied = false;  // one device per process
  if (!codes_copied) {
    const Code host[2] = {code_of(true), code_of(false)};
    CUDA_CHECK(cudaMemcpyToSymbol(d_codes, host, sizeof host));
    codes_copied = true;
  }
  if (a.n == 0) return;
  const size_t blocks = quant_blocks(a.n);
  if (a.state == StateType::Int8) lowp_kernel<Rule, X, true><<<unsigned(blocks), kQuantBlock, 0, s>>>(a);
  else lowp_kernel<Rule, X, false><<<unsigned(blocks), kQuantBlock, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <class Rule, class X>
void launch(const StepArgs& a, cudaStream_t s) {
  if (a.state != StateType::F32) return launch_lowp<Rule, X>(a, s);
  constexpr int V = kStepVec;  // 8: 16-byte bf16 accesses, two 16-byte fp32 ones (step_host follows)
  bool vec = is_aligned(a.grad, V * sizeof(X)) && is_aligned(a.param, V * sizeof(X)) && is_aligned(a.master, 4 * V) &&
             is_aligned(a.residual, 2 * V);
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

namespace {
struct ResidualOp {
  uint16_t* residual;
  const float* w;
  __device__ void operator()(size_t i) const { residual[i] = compensated_split(w[i]).lo; }
};
}  // namespace

void compensated_residuals_cuda(uint16_t* residual, const float* w, size_t n, void* stream) {
  kern::launch_elementwise(n, ResidualOp{residual, w}, static_cast<cudaStream_t>(stream));
}

}  // namespace gpt::optim
