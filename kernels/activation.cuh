// The MLP's activation (model.activation; the math: base/activation.hpp): the forward, for recomputation
// and for products whose epilogue cannot apply it, and the in-place backward. GELU's tanh-form kernels are
// also what the GELU epilogues fall back to (matmul.cu, matmul_fp8.cu). X is the activation dtype: float
// or bf16.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "base/common.hpp"
#include "common.cuh"

namespace gpt::kern {

template <class X>
void gelu_fwd(X* out, const X* inp, size_t n, cudaStream_t s);  // out (n) = gelu(inp (n))
template <class X>
void gelu_bwd_inplace(X* d, const X* pre_gelu, size_t n, cudaStream_t s);  // d (n) *= gelu'(pre_gelu (n))

template <class X>
void activation_fwd(Activation act, X* out, const X* inp, size_t n, cudaStream_t s);  // out (n) = act(inp (n))
template <class X>
void activation_bwd_inplace(Activation act, X* d, const X* pre, size_t n, cudaStream_t s);  // d (n) *= act'(pre (n))

}  // namespace gpt::kern
