// Fused softmax + cross-entropy over the padded vocabulary (classifier.cu). X is the activation dtype:
// float or bf16; row-major.
#pragma once
#include <cuda_runtime.h>

#include "common.cuh"

namespace gpt::kern {

template <class X>
struct ClassifierArgs {
  X* logits = nullptr;           // (N, Vp); overwritten by the gradient when dloss != 0
  float* losses = nullptr;       // (N)
  const int* targets = nullptr;  // (N)
  int N = 0, V = 0, Vp = 0;      // V real columns of Vp
  float dloss = 0;               // the gradient of the loss with respect to each row's loss, or 0
};
template <class X>
void classifier(const ClassifierArgs<X>& a, cudaStream_t s);

}  // namespace gpt::kern
