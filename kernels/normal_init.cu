// GPT-2's normal initialisation, one value a thread in a grid-stride loop: two SplitMix64 draws, Box-Muller
// in double (Hopper's double units make 1.56 billion values about 10 ms), the rounding to float checked.
#include "normal_init.cuh"

#include "base/random.hpp"

namespace gpt::kern {

namespace {
__global__ void normal_init_kernel(float* __restrict__ dst, size_t n, uint64_t seed, uint64_t index, float sd,
                                   uint64_t* __restrict__ flagged, size_t cap, unsigned long long* count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double v = normal_init_value(seed, index + i, sd);
    const double g = fabs(v) * kNormalInitGuard;
    if (__double2float_rn(v - g) != __double2float_rn(v + g)) {
      const unsigned long long k = atomicAdd(count, 1ull);
      if (k < cap) flagged[k] = i;
    }
    dst[i] = __double2float_rn(v);
  }
}

__global__ void scatter_kernel(float* __restrict__ dst, const uint64_t* __restrict__ at,
                               const float* __restrict__ val, size_t n) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n; k += size_t(gridDim.x) * blockDim.x)
    dst[at[k]] = val[k];
}

unsigned grid_for(size_t n, int threads) {
  return unsigned(std::min<size_t>((n + threads - 1) / threads, size_t(sm_count()) * 16));
}
}  // namespace

void normal_init(float* dst, size_t n, uint64_t seed, uint64_t index, float sd, uint64_t* flagged, size_t cap,
                 unsigned long long* count, cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof *count, s));
  if (n == 0) return;
  normal_init_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, n, seed, index, sd, flagged, cap, count);
  CUDA_CHECK(cudaGetLastError());
}

void scatter(float* dst, const uint64_t* at, const float* val, size_t n, cudaStream_t s) {
  if (n == 0) return;
  scatter_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, at, val, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace gpt::kern
