// AdamW (decoupled weight decay, bias-corrected moments) in one pass (adamw.cu). X is the parameter
// and gradient dtype: float or bf16.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace gpt::kern {

template <class X>
struct AdamWLaunch {
  X* param = nullptr;         // (n)
  float* master = nullptr;    // (n) or null: then param is read, updated and written back
  const X* grad = nullptr;    // (n)
  float* m = nullptr;         // (n)
  float* v = nullptr;         // (n)
  size_t n = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_scale = 1;
  float bc1 = 1, bc2 = 1;     // 1 - beta^step
  uint64_t seed = 0;
  uint64_t index_offset = 0;  // logical index of element 0: rounding is the same however the tensor is split
  bool stochastic = true;     // bf16 params: stochastic rounding (seed ^ index) instead of nearest
  unsigned* nonfinite = nullptr;  // (1) or null: set to 1 when an updated value (w, m, v) is not finite
};
template <class X>
void adamw(const AdamWLaunch<X>& a, cudaStream_t s);

}  // namespace gpt::kern
