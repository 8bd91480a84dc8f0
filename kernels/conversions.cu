// fp32 <-> bf16 conversion and the elementwise add used for gradient accumulation.
// Each kernel handles V elements per thread with 16-byte (or 8-byte) accesses; a scalar launch covers
// the tail and unaligned pointers.
#include "check.cuh"
#include "conversions.cuh"

namespace gpt::kern {

namespace {
constexpr int kThreads = 256;

template <int V>
__global__ void f32_to_bf16_kernel(bf16* __restrict__ dst, const float* __restrict__ src, size_t nv) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x) {
    const Vec<float, V> x = ldv<float, V>(src + i * V);
    Vec<bf16, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = __float2bfloat16_rn(x.v[k]);
    stv<bf16, V>(dst + i * V, y);
  }
}
template <int V>
__global__ void bf16_to_f32_kernel(float* __restrict__ dst, const bf16* __restrict__ src, size_t nv) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x) {
    const Vec<bf16, V> x = ldv<bf16, V>(src + i * V);
    Vec<float, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = __bfloat162float(x.v[k]);
    stv<float, V>(dst + i * V, y);
  }
}
template <class X, int V>
__global__ void add_inplace_kernel(X* __restrict__ dst, const X* __restrict__ src, size_t nv) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x) {
    Vec<X, V> d = ldv<X, V>(dst + i * V);
    const Vec<X, V> x = ldv<X, V>(src + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) d.v[k] = from_f<X>(to_f(d.v[k]) + to_f(x.v[k]));
    stv<X, V>(dst + i * V, d);
  }
}

inline unsigned grid_for(size_t nv) {
  // a grid-stride loop: enough blocks to fill the chip several times over, no more
  return unsigned(std::min<size_t>(ceil_div(long(nv), kThreads), 132 * 16));
}
}  // namespace

// Vector path for the aligned bulk (4 floats / 4 bf16 per thread), scalar path for the rest.
void f32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  size_t bulk = (is_aligned(dst, 8) && is_aligned(src, 16)) ? n / 4 * 4 : 0;
  if (bulk) f32_to_bf16_kernel<4><<<grid_for(bulk / 4), kThreads, 0, s>>>(dst, src, bulk / 4);
  if (n > bulk) f32_to_bf16_kernel<1><<<grid_for(n - bulk), kThreads, 0, s>>>(dst + bulk, src + bulk, n - bulk);
  CUDA_CHECK_LAUNCH();
}
void bf16_to_f32(float* dst, const bf16* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  size_t bulk = (is_aligned(dst, 16) && is_aligned(src, 8)) ? n / 4 * 4 : 0;
  if (bulk) bf16_to_f32_kernel<4><<<grid_for(bulk / 4), kThreads, 0, s>>>(dst, src, bulk / 4);
  if (n > bulk) bf16_to_f32_kernel<1><<<grid_for(n - bulk), kThreads, 0, s>>>(dst + bulk, src + bulk, n - bulk);
  CUDA_CHECK_LAUNCH();
}
template <class X>
void add_inplace(X* dst, const X* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = kVec16<X>;
  size_t bulk = (is_aligned(dst, 16) && is_aligned(src, 16)) ? n / V * V : 0;
  if (bulk) add_inplace_kernel<X, V><<<grid_for(bulk / V), kThreads, 0, s>>>(dst, src, bulk / V);
  if (n > bulk) add_inplace_kernel<X, 1><<<grid_for(n - bulk), kThreads, 0, s>>>(dst + bulk, src + bulk, n - bulk);
  CUDA_CHECK_LAUNCH();
}
template void add_inplace<float>(float*, const float*, size_t, cudaStream_t);
template void add_inplace<bf16>(bf16*, const bf16*, size_t, cudaStream_t);

}  // namespace gpt::kern
