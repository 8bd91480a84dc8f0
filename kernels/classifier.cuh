// Fused softmax + cross-entropy over the padded vocabulary (classifier.cu). X is the activation dtype:
// float or bf16; row-major.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common.cuh"
#include "base/fp8_math.hpp"

namespace gpt::kern {

// The logits' gradient as FP8 bytes (precision fp8 with training.fp8_classifier), for the gradient
// products that read it: out = fp8(g * scale), nearest even, saturating at the format's largest value;
// max |g| (a NaN counts as infinity) folded into *amax.
struct ClassifierFp8Grad {
  uint8_t* out = nullptr;        // (N, Vp) or null: the gradient overwrites the logits instead
  const float* scale = nullptr;  // (1) device
  float* amax = nullptr;         // (1) device, or null: not recorded
  fp8::Format fmt = fp8::Format::E5M2;
};

template <class X>
struct ClassifierArgs {
  X* logits = nullptr;           // (N, Vp); overwritten by the gradient when dloss != 0 and q.out is null
  float* losses = nullptr;       // (N)
  const int* targets = nullptr;  // (N)
  int N = 0, V = 0, Vp = 0;      // V real columns of Vp
  float dloss = 0;               // the gradient of the loss with respect to each row's loss, or 0
  // q.out set: the gradient goes there (always, zeros for dloss 0) and the logits are only read
  ClassifierFp8Grad q;
};
template <class X>
void classifier(const ClassifierArgs<X>& a, cudaStream_t s);

}  // namespace gpt::kern
