// GPT-2's normal initialisation, one value a thread (common.cuh's elementwise launcher): two SplitMix64
// draws, Box-Muller in double (Hopper's double units make 1.56 billion values about 10 ms), the rounding to
// float checked.
#include "normal_init.cuh"

#include "base/random.hpp"

namespace gpt::kern {

namespace {
struct NormalInitOp {
  float* dst;
  uint64_t seed, index;
  float sd;
  uint64_t* flagged;
  size_t cap;
  unsigned long long* count;
  __device__ void operator()(size_t i) const {
    const double v = normal_init_value(seed, index + i, sd);
    const double g = fabs(v) * kNormalInitGuard;
    if (__double2float_rn(v - g) != __double2float_rn(v + g)) {
      const unsigned long long k = atomicAdd(count, 1ull);
      if (k < cap) flagged[k] = i;
    }
    dst[i] = __double2float_rn(v);
  }
};
struct ScatterOp {
  float* dst;
  const uint64_t* at;
  const float* val;
  __device__ void operator()(size_t k) const { dst[at[k]] = val[k]; }
};
}  // namespace

void normal_init(float* dst, size_t n, uint64_t seed, uint64_t index, float sd, uint64_t* flagged, size_t cap,
                 unsigned long long* count, cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof *count, s));
  launch_elementwise(n, NormalInitOp{dst, seed, index, sd, flagged, cap, count}, s);
}

void scatter(float* dst, const uint64_t* at, const float* val, size_t n, cudaStream_t s) {
  launch_elementwise(n, ScatterOp{dst, at, val}, s);
}

}  // namespace gpt::kern
