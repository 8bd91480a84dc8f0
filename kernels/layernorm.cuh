// LayerNorm and RMSNorm (rms: no mean, no bias), eps 1e-5: the forward (layernorm_fwd.cu), with the
// residual add fused in, and the deterministic backward (layernorm_bwd.cu), with the column sums of the
// input gradient fused in. X is the activation dtype: float or bf16; row-major.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common.cuh"
#include "base/fp8_math.hpp"

namespace gpt::kern {

template <class X>
struct LayerNormFwdArgs {
  X* out = nullptr;           // (N, C)
  float* mean = nullptr;      // (N), may be null
  float* rstd = nullptr;      // (N), may be null
  const X* inp = nullptr;     // (N, C); unused when residual is set
  X* residual = nullptr;      // (N, C): if set, residual = a + b is written and normalised
  const X* a = nullptr;       // (N, C)
  const X* b = nullptr;       // (N, C)
  const X* w = nullptr;       // (C)
  const X* bias = nullptr;    // (C); null: none (model.bias false); unused with rms
  int N = 0, C = 0;
  bool rms = false;           // RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); mean not written
  // FP8 output instead of `out` (precision fp8): fp8(y * *fp8_scale) bytes (N, C), max |y| into *fp8_amax
  uint8_t* out_fp8 = nullptr;
  const float* fp8_scale = nullptr;
  float* fp8_amax = nullptr;        // nullable
  fp8::Format fp8_fmt = fp8::Format::E4M3;
};
template <class X>
void layernorm_fwd(const LayerNormFwdArgs<X>& a, cudaStream_t s);

template <class X>
struct LayerNormBwdArgs {
  X* dinp = nullptr;            // (N, C) accumulated
  X* dw = nullptr;              // (C) accumulated
  X* db = nullptr;              // (C) accumulated; null: no bias (rms, model.bias false)
  const X* dout = nullptr;      // (N, C)
  const X* inp = nullptr;       // (N, C)
  const X* w = nullptr;         // (C)
  const float* mean = nullptr;  // (N); unused (may be null) with rms
  const float* rstd = nullptr;  // (N)
  int N = 0, C = 0;
  bool rms = false;              // RMSNorm's backward (xhat = x * rstd, no mean term, no bias)
  float* dinp_colsum = nullptr;  // (C) or null: overwritten with the column sums of dinp after the update
  float* scratch = nullptr;      // layernorm_bwd_scratch_bytes(N, C, num_sms) bytes
  int num_sms = 0;               // the device's multiprocessors: the grid fills them once
};
size_t layernorm_bwd_scratch_bytes(int N, int C, int num_sms);
// throws KernelError(kUnsupported) for rows wider than the kernels take
template <class X>
void layernorm_bwd(const LayerNormBwdArgs<X>& a, cudaStream_t s);

}  // namespace gpt::kern
