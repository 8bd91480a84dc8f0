// The MLP's activations: GELU, tanh approximation (as GPT-2 and cuBLASLt's GELU epilogue), and relu2
// (base/activation.hpp): forward, for recomputation, and the in-place backward used when no matmul
// epilogue fuses it. 16-byte vectors in the aligned bulk, the scalar path for the rest
// (launch_elementwise_vec, common.cuh).
#include "activation.cuh"

#include "base/activation.hpp"  // relu2; GELU's two constants (base/gelu_logistic.hpp), one place for every backend

namespace gpt::kern {

namespace {
// A grid-stride loop over 16 blocks an SM: measured for GELU on an H200 over 201M bf16 elements, forward 0.211
// and backward 0.300 ms, against 0.229 and 0.309 ms for one vector a thread (the default, common.cuh).
constexpr int kActBlocksPerSm = 16;

__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

struct Gelu {
  __device__ __forceinline__ static float fwd(float x) { return gelu(x); }
  __device__ __forceinline__ static float grad(float x) { return gelu_grad(x); }
};
struct Relu2 {
  __device__ __forceinline__ static float fwd(float x) { return relu2(x); }
  __device__ __forceinline__ static float grad(float x) { return relu2_grad(x); }
};

template <class X, class A>
struct ActFwd {
  X* __restrict__ out;
  const X* __restrict__ inp;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    const Vec<X, V> x = ldv<X, V>(inp + e);
    Vec<X, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = from_f<X>(A::fwd(to_f(x.v[k])));
    stv<X, V>(out + e, y);
  }
};
template <class X, class A>
struct ActBwdInplace {
  X* __restrict__ d;
  const X* __restrict__ pre;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    Vec<X, V> g = ldv<X, V>(d + e);
    const Vec<X, V> x = ldv<X, V>(pre + e);
#pragma unroll
    for (int k = 0; k < V; ++k) g.v[k] = from_f<X>(to_f(g.v[k]) * A::grad(to_f(x.v[k])));
    stv<X, V>(d + e, g);
  }
};

template <class A, class X>
void act_fwd(X* out, const X* inp, size_t n, cudaStream_t s) {
  launch_elementwise_vec<kVec16<X>>(n, is_aligned(out, 16) && is_aligned(inp, 16), ActFwd<X, A>{out, inp}, s,
                                    kActBlocksPerSm);
}
template <class A, class X>
void act_bwd_inplace(X* d, const X* pre, size_t n, cudaStream_t s) {
  launch_elementwise_vec<kVec16<X>>(n, is_aligned(d, 16) && is_aligned(pre, 16), ActBwdInplace<X, A>{d, pre}, s,
                                    kActBlocksPerSm);
}
}  // namespace

template <class X>
void gelu_fwd(X* out, const X* inp, size_t n, cudaStream_t s) {
  act_fwd<Gelu>(out, inp, n, s);
}
template <class X>
void gelu_bwd_inplace(X* d, const X* pre, size_t n, cudaStream_t s) {
  act_bwd_inplace<Gelu>(d, pre, n, s);
}
// fn(A{}) with A the functor of activation `act`: the one place a new activation is dispatched
template <class Fn>
void with_activation(Activation act, Fn fn) {
  if (act == Activation::relu2)
    fn(Relu2{});
  else
    fn(Gelu{});
}
template <class X>
void activation_fwd(Activation act, X* out, const X* inp, size_t n, cudaStream_t s) {
  with_activation(act, [&](auto a) { act_fwd<decltype(a)>(out, inp, n, s); });
}
template <class X>
void activation_bwd_inplace(Activation act, X* d, const X* pre, size_t n, cudaStream_t s) {
  with_activation(act, [&](auto a) { act_bwd_inplace<decltype(a)>(d, pre, n, s); });
}
template void gelu_fwd<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_fwd<bf16>(bf16*, const bf16*, size_t, cudaStream_t);
template void gelu_bwd_inplace<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_bwd_inplace<bf16>(bf16*, const bf16*, size_t, cudaStream_t);
template void activation_fwd<float>(Activation, float*, const float*, size_t, cudaStream_t);
template void activation_fwd<bf16>(Activation, bf16*, const bf16*, size_t, cudaStream_t);
template void activation_bwd_inplace<float>(Activation, float*, const float*, size_t, cudaStream_t);
template void activation_bwd_inplace<bf16>(Activation, bf16*, const bf16*, size_t, cudaStream_t);

}  // namespace gpt::kern
