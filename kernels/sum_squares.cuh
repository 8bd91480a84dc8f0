// Sum of squares, for the global gradient norm (sum_squares.cu): deterministic, and the same on every
// device. X is the dtype of x: float or bf16.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common.cuh"

namespace gpt::kern {

size_t sum_squares_scratch_bytes();
// *out (one double, device memory) = sum of x[i]^2 over x (n); scratch: sum_squares_scratch_bytes() bytes
template <class X>
void sum_squares(double* out, const X* x, size_t n, void* scratch, cudaStream_t s);

}  // namespace gpt::kern
