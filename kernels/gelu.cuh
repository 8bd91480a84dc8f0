// GELU, tanh approximation (gelu.cu): the forward, for recomputation, and the in-place backward used
// when the matmul epilogue cannot fuse it. X is the activation dtype: float or bf16.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common.cuh"

namespace gpt::kern {

template <class X>
void gelu_fwd(X* out, const X* inp, size_t n, cudaStream_t s);  // out (n) = gelu(inp (n))
template <class X>
void gelu_bwd_inplace(X* d, const X* pre_gelu, size_t n, cudaStream_t s);  // d (n) *= gelu'(pre_gelu (n))

}  // namespace gpt::kern
