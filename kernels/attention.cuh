// Causal self-attention through cuDNN's fused flash attention (SDPA forward with softmax stats, SDPA
// backward), built with the cudnn-frontend graph API. This is the only file that includes the frontend
// (it compiles slowly). One graph per (B, T, NH, HS) and direction, built on first use and kept here.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace gpt::kern {

struct AttentionShape {
  int B = 0, T = 0, NH = 0, HS = 0;
};

class CudnnAttention {
 public:
  // alloc/free: device memory for cuDNN's workspace, through the owner's allocator (so it is counted).
  // deterministic: ask for the backward algorithm without atomics (dQ reduced in a fixed order).
  CudnnAttention(std::function<void*(size_t)> alloc, std::function<void(void*)> free, bool deterministic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // qkv (B,T,3,NH,HS) bf16; out (B,T,NH,HS) bf16; lse (B,NH,T) fp32: natural-log logsumexp of the
  // scaled scores, which is what cuDNN calls the softmax stats.
  void fwd(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const AttentionShape& sh, cudaStream_t s);
  // dqkv (B,T,3,NH,HS) overwritten
  void bwd(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
           const float* lse, const AttentionShape& sh, cudaStream_t s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt::kern
