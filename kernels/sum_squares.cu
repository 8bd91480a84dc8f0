// Sum of squares (for the global gradient norm), deterministic: a fixed grid of blocks, each thread a
// fixed strided slice in fp32, block partials in a fixed order, then one block sums the partials in
// double. The grid does not depend on the device, so results match across machines. (A reduction, so
// not launch_elementwise: its grid is part of the result.)
#include "sum_squares.cuh"

namespace gpt::kern {

namespace {
constexpr int kThreads = 512;
constexpr int kBlocks = 1024;

template <class X, int V>
__global__ void __launch_bounds__(kThreads) sum_squares_kernel(float* __restrict__ part, const X* __restrict__ x,
                                                               size_t nv, const X* __restrict__ tail, int ntail) {
  __shared__ float sh[32];
  float acc = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x) {
    const Vec<X, V> v = ldv<X, V>(x + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) acc += to_f(v.v[k]) * to_f(v.v[k]);
  }
  if (blockIdx.x == 0 && int(threadIdx.x) < ntail) acc += to_f(tail[threadIdx.x]) * to_f(tail[threadIdx.x]);
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
__global__ void sum_partials_kernel(double* out, const float* __restrict__ part, int n) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) s += sh[w];
    *out = s;
  }
}
}  // namespace

size_t sum_squares_scratch_bytes() { return kBlocks * sizeof(float); }

template <class X>
void sum_squares(double* out, const X* x, size_t n, void* scratch, cudaStream_t s) {
  float* part = static_cast<float*>(scratch);
  constexpr int V = kVec16<X>;
  // the tail (< V elements) is folded into block 0; an unaligned x takes the scalar path
  if (is_aligned(x, 16)) {
    const size_t nv = n / V;
    sum_squares_kernel<X, V><<<kBlocks, kThreads, 0, s>>>(part, x, nv, x + nv * V, int(n - nv * V));
  } else {
    sum_squares_kernel<X, 1><<<kBlocks, kThreads, 0, s>>>(part, x, n, x, 0);
  }
  CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, 256, 0, s>>>(out, part, kBlocks);
  CUDA_CHECK_LAUNCH();
}
template void sum_squares<float>(double*, const float*, size_t, void*, cudaStream_t);
template void sum_squares<bf16>(double*, const bf16*, size_t, void*, cudaStream_t);

}  // namespace gpt::kern
