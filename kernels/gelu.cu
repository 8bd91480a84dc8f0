// GELU, tanh approximation (as GPT-2 and cuBLASLt's GELU epilogue): forward, for recomputation, and the
// in-place backward used when the matmul epilogue cannot fuse it.
#include "check.cuh"
#include "gelu.cuh"

namespace gpt::kern {

namespace {
constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

template <class X, int V>
__global__ void gelu_fwd_kernel(X* __restrict__ out, const X* __restrict__ inp, size_t nv) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x) {
    const Vec<X, V> x = ldv<X, V>(inp + i * V);
    Vec<X, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = from_f<X>(gelu(to_f(x.v[k])));
    stv<X, V>(out + i * V, y);
  }
}
template <class X, int V>
__global__ void gelu_bwd_inplace_kernel(X* __restrict__ d, const X* __restrict__ pre, size_t nv) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x) {
    Vec<X, V> g = ldv<X, V>(d + i * V);
    const Vec<X, V> x = ldv<X, V>(pre + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) g.v[k] = from_f<X>(to_f(g.v[k]) * gelu_grad(to_f(x.v[k])));
    stv<X, V>(d + i * V, g);
  }
}
inline unsigned grid_for(size_t nv) { return unsigned(std::min<size_t>(ceil_div(long(nv), kThreads), 132 * 16)); }
}  // namespace

template <class X>
void gelu_fwd(X* out, const X* inp, size_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = kVec16<X>;
  size_t bulk = (is_aligned(out, 16) && is_aligned(inp, 16)) ? n / V * V : 0;
  if (bulk) gelu_fwd_kernel<X, V><<<grid_for(bulk / V), kThreads, 0, s>>>(out, inp, bulk / V);
  if (n > bulk) gelu_fwd_kernel<X, 1><<<grid_for(n - bulk), kThreads, 0, s>>>(out + bulk, inp + bulk, n - bulk);
  CUDA_CHECK_LAUNCH();
}
template <class X>
void gelu_bwd_inplace(X* d, const X* pre, size_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = kVec16<X>;
  size_t bulk = (is_aligned(d, 16) && is_aligned(pre, 16)) ? n / V * V : 0;
  if (bulk) gelu_bwd_inplace_kernel<X, V><<<grid_for(bulk / V), kThreads, 0, s>>>(d, pre, bulk / V);
  if (n > bulk)
    gelu_bwd_inplace_kernel<X, 1><<<grid_for(n - bulk), kThreads, 0, s>>>(d + bulk, pre + bulk, n - bulk);
  CUDA_CHECK_LAUNCH();
}
template void gelu_fwd<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_fwd<bf16>(bf16*, const bf16*, size_t, cudaStream_t);
template void gelu_bwd_inplace<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_bwd_inplace<bf16>(bf16*, const bf16*, size_t, cudaStream_t);

}  // namespace gpt::kern
