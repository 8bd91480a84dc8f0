// GPT-2's normal initialisation on the device (normal_init.cu): the values of base/random.hpp's
// normal_init_value, with the few the host may round otherwise marked for it to compute.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace gpt::kern {

// dst (n) = float(normal_init_value(seed, index + i, sd)). Every i whose double lies within
// kNormalInitGuard of a float rounding boundary is counted in *count (device memory, zeroed here) and, the
// first cap of them, written to flagged (device memory, cap entries) in no particular order.
void normal_init(float* dst, size_t n, uint64_t seed, uint64_t index, float sd, uint64_t* flagged, size_t cap,
                 unsigned long long* count, cudaStream_t s);
// dst[at[k]] = val[k] for k < n (device memory)
void scatter(float* dst, const uint64_t* at, const float* val, size_t n, cudaStream_t s);

}  // namespace gpt::kern
