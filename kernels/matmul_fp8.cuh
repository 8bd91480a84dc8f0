// The block products on FP8 operands (precision fp8) through cuBLASLt (matmul.cuh's CublasLt): E4M3 or
// E5M2 inputs with per-tensor dequantizing scales, fp32 accumulation, bf16 output. FP8 tensor cores take
// K-major operands only, so every operand arrives laid out with the summed dimension contiguous: the
// input gradient takes the weight transposed, the weight gradient both operands transposed.
#pragma once
#include <cuda_runtime.h>

#include "base/fp8_math.hpp"
#include "matmul.cuh"

namespace gpt::kern {

struct Fp8Operand {
  const void* data = nullptr;       // FP8 bytes
  const float* scale_inv = nullptr; // (1) device
  fp8::Format fmt = fp8::Format::E4M3;
};

struct MatmulFp8FwdArgs {
  void* out = nullptr;         // (N, OC) bf16
  Fp8Operand inp;              // (N, IC)
  Fp8Operand w;                // (OC, IC)
  const void* bias = nullptr;  // (OC) bf16 or null
  int N = 0, IC = 0, OC = 0;
  void* pre_gelu = nullptr;    // (N, OC) bf16 or null: pre_gelu = the product, out = gelu(pre_gelu)
};
// Throw KernelError(kUnsupported) when cuBLASLt has no algorithm and no fallback is left.
void matmul_fp8_fwd(CublasLt& lt, const MatmulFp8FwdArgs& a, cudaStream_t s);
// out (N, OC) FP8 bytes = fp8(gelu_tanh(inp @ w^T + bias) * out_scale) from cuBLASLt's GELU_AUX epilogue,
// pre_gelu (N, OC) bf16 the product before GELU; max |gelu| written to *amax_slot (overwritten).
// false: cuBLASLt has no algorithm for this (nothing was written).
struct MatmulFp8GeluQArgs {
  void* out = nullptr;              // (N, OC) FP8
  fp8::Format out_fmt = fp8::Format::E4M3;
  const float* out_scale = nullptr; // (1) device
  float* amax_slot = nullptr;       // (1) device
  Fp8Operand inp, w;
  const void* bias = nullptr;       // (OC) bf16 or null
  void* pre_gelu = nullptr;         // (N, OC) bf16
  int N = 0, IC = 0, OC = 0;
};
bool matmul_fp8_fwd_gelu_q(CublasLt& lt, const MatmulFp8GeluQArgs& a, cudaStream_t s);
// dinp (N, IC) bf16 = dout (N, OC) @ w, from w_t (IC, OC); overwrites. pre_gelu (N, IC) bf16 or null:
// dinp *= gelu'(pre_gelu), in the DGELU epilogue (or a separate kernel where cuBLASLt has none). The
// epilogue is correct but slow with FP8 operands on an H200 (5x the plain product at GPT-2 124M), so the
// model applies GELU's derivative in the gradient's FP8 cast instead (model/block.cpp).
// fast_accum: sums without the periodic promotion to fp32 (fp8::FastAccum), here and in matmul_fp8_dw.
void matmul_fp8_dinp(CublasLt& lt, void* dinp, const Fp8Operand& dout, const Fp8Operand& w_t, int N, int IC, int OC,
                     const void* pre_gelu, bool fast_accum, cudaStream_t s);
// dw (OC, IC) bf16 += dout^T @ inp, from dout_t (OC, N) and inp_t (IC, N)
void matmul_fp8_dw(CublasLt& lt, void* dw, const Fp8Operand& dout_t, const Fp8Operand& inp_t, int N, int IC, int OC,
                   bool fast_accum, cudaStream_t s);

}  // namespace gpt::kern
