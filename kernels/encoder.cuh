// Token + position embedding (encoder.cu). X is the activation dtype: float or bf16; row-major.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "common.cuh"

namespace gpt::kern {

// out[b, t] = wte[tokens[b, t]] + wpe[t] (wte[tokens[b, t]] without wpe)
template <class X>
struct EncoderFwdArgs {
  X* out = nullptr;             // (B, T, C)
  const int* tokens = nullptr;  // (B, T)
  const X* wte = nullptr;       // (Vp, C)
  const X* wpe = nullptr;       // (maxT, C), or nullptr: no position embedding
  int B = 0, T = 0, C = 0;
};
template <class X>
void encoder_fwd(const EncoderFwdArgs<X>& a, cudaStream_t s);

// Deterministic: no float atomics.
template <class X>
struct EncoderBwdArgs {
  X* dwte = nullptr;            // (Vp, C) accumulated
  X* dwpe = nullptr;            // (maxT, C) accumulated; nullptr: no position embedding
  const X* dout = nullptr;      // (B, T, C)
  const int* tokens = nullptr;  // (B, T)
  int B = 0, T = 0, C = 0;
  void* scratch = nullptr;      // encoder_bwd_scratch_bytes(B*T) bytes of device memory
};
size_t encoder_bwd_scratch_bytes(int n_tokens);
template <class X>
void encoder_bwd(const EncoderBwdArgs<X>& a, cudaStream_t s);

}  // namespace gpt::kern
