// Rotary position embedding of the queries and keys (rope.cu; the math: base/rope.hpp). X is the activation
// dtype: float or bf16.
#pragma once
#include <cuda_runtime.h>

#include "common.cuh"

namespace gpt::kern {

// qkv (B, T, 3, NH, HS), in place: q and k of every head rotated by their position (v untouched);
// `inverse`: by the negative angle (the backward, on dqkv)
template <class X>
struct RopeArgs {
  X* qkv = nullptr;
  int B = 0, T = 0, NH = 0, HS = 0;
  bool inverse = false;
};
template <class X>
void rope(const RopeArgs<X>& a, cudaStream_t s);

}  // namespace gpt::kern
