// fp32 <-> bf16 conversion and the elementwise add used for gradient accumulation (conversions.cu).
// X is the activation dtype: float or bf16. No launcher allocates or synchronises with the host.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common.cuh"

namespace gpt::kern {

void f32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t s);  // dst (n) = src (n), nearest even
void bf16_to_f32(float* dst, const bf16* src, size_t n, cudaStream_t s);  // dst (n) = src (n)
template <class X>
void add_inplace(X* dst, const X* src, size_t n, cudaStream_t s);  // dst (n) += src (n)

}  // namespace gpt::kern
