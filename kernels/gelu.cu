// GELU, tanh approximation (as GPT-2 and cuBLASLt's GELU epilogue): forward, for recomputation, and the
// in-place backward used when the matmul epilogue cannot fuse it. 16-byte vectors in the aligned bulk,
// the scalar path for the rest (launch_elementwise_vec, common.cuh).
#include "gelu.cuh"

#include "base/gelu_logistic.hpp"  // GELU's two constants, one place for every backend

namespace gpt::kern {

namespace {
// A grid-stride loop over 16 blocks an SM: measured on an H200 over 201M bf16 elements, forward 0.211
// and backward 0.300 ms, against 0.229 and 0.309 ms for one vector a thread (the default, common.cuh).
constexpr int kGeluBlocksPerSm = 16;

__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

template <class X>
struct GeluFwd {
  X* __restrict__ out;
  const X* __restrict__ inp;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    const Vec<X, V> x = ldv<X, V>(inp + e);
    Vec<X, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = from_f<X>(gelu(to_f(x.v[k])));
    stv<X, V>(out + e, y);
  }
};
template <class X>
struct GeluBwdInplace {
  X* __restrict__ d;
  const X* __restrict__ pre;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    Vec<X, V> g = ldv<X, V>(d + e);
    const Vec<X, V> x = ldv<X, V>(pre + e);
#pragma unroll
    for (int k = 0; k < V; ++k) g.v[k] = from_f<X>(to_f(g.v[k]) * gelu_grad(to_f(x.v[k])));
    stv<X, V>(d + e, g);
  }
};
}  // namespace

template <class X>
void gelu_fwd(X* out, const X* inp, size_t n, cudaStream_t s) {
  launch_elementwise_vec<kVec16<X>>(n, is_aligned(out, 16) && is_aligned(inp, 16), GeluFwd<X>{out, inp}, s,
                                    kGeluBlocksPerSm);
}
template <class X>
void gelu_bwd_inplace(X* d, const X* pre, size_t n, cudaStream_t s) {
  launch_elementwise_vec<kVec16<X>>(n, is_aligned(d, 16) && is_aligned(pre, 16), GeluBwdInplace<X>{d, pre}, s,
                                    kGeluBlocksPerSm);
}
template void gelu_fwd<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_fwd<bf16>(bf16*, const bf16*, size_t, cudaStream_t);
template void gelu_bwd_inplace<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_bwd_inplace<bf16>(bf16*, const bf16*, size_t, cudaStream_t);

}  // namespace gpt::kern
