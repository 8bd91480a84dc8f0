// FP8 ops (training.precision fp8): the four block products of every layer and, with
// training.fp8_classifier, the classifier's three run on FP8 operands, one scale per tensor (delayed
// scaling; the recipe and its state: model/fp8_scaling.hpp). The products are the backend's own
// (Backend::matmul_fwd and matmul_bwd with FP8 operands); the ops here make their operands (casts,
// transposes) and the scales; the classifier's FP8 gradient is Backend::classifier's `dlogits`. A backend offers them through
// Backend::fp8(); conventions as in backend.hpp, and:
// - `x` tensors are the backend's activation dtype; FP8 tensors are bytes (Fp8Tensor::data).
// - Quantizing x gives q = fp8(x * scale) (nearest even, saturating at the format's largest value) and
//   folds max |x| into *amax, in the kernel that writes q; the products multiply by scale_inv.
// - "_t" tensors hold a matrix transposed: (C, N) bytes for an (N, C) tensor. The weight-gradient
//   product needs both of its operands transposed (FP8 tensor cores take K-major operands only).
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/fp8.hpp"

namespace gpt {

struct Fp8Tensor {
  void* data = nullptr;             // FP8 bytes
  const float* scale = nullptr;     // (1) multiplies x before the rounding to FP8
  const float* scale_inv = nullptr; // (1) 1 / scale: dequantizes; 16-byte aligned (cuBLASLt reads it)
  float* amax = nullptr;            // (1) max |x| is folded in here; nullable (not recorded)
  Fp8Format fmt = Fp8Format::E4M3;
};

// The end of a step under delayed scaling, for n scaled tensors with H-deep amax histories: slot
// `row` of the history takes this step's amax; a tensor whose amax exceeded maxval / scale (values were
// clipped) adds 1 to *saturated; each scale becomes fp8::scale_for(max over the history); amax is reset.
struct Fp8ScalesArgs {
  float* amax = nullptr;         // (n)
  float* history = nullptr;      // (H, n)
  float* scale = nullptr;        // (n)
  float* scale_inv = nullptr;    // (n, every fp8::kScaleInvStride-th float)
  const float* maxval = nullptr; // (n) the largest finite value of each tensor's format
  unsigned* saturated = nullptr; // (1) accumulated
  int n = 0, H = 0, row = 0;
  int margin = 0;                // headroom: each scale divided by 2^margin
};

class Fp8Ops {
 public:
  virtual ~Fp8Ops() = default;
  // Quantizes v = x (N, C), or v = x * gelu_tanh'(gelu_in) with gelu_in non-null, into q.data (N, C)
  // and/or q_t (C, N) (either nullable). colsum (C, fp32, nullable) is overwritten with the column sums
  // of v before rounding (the bias gradient of the product whose output gradient v is). GELU here and
  // in cast_gelu is computed as base/gelu_logistic.hpp does, on every backend.
  virtual void cast(const Fp8Tensor& q, void* q_t, const void* x, const void* gelu_in, float* colsum, int N,
                    int C) = 0;
  // Quantizes v = gelu_tanh(pre) (pre (N, C): a product's output before GELU) into q.data (N, C) and/or
  // q_t (C, N), as cast() does: GELU's output in FP8 for the next product, the same bytes wherever it is
  // made (the forward, or recomputation in the backward).
  virtual void cast_gelu(const Fp8Tensor& q, void* q_t, const void* pre, int N, int C) = 0;
  // Quantizes n consecutive elements x (no layout: a piece of a weight, cast where it is kept) into
  // q.data (n), folding max |x| into *q.amax: the bytes cast() gives those elements.
  virtual void quantize(const Fp8Tensor& q, const void* x, size_t n) = 0;
  // dst (C, N) = src (N, C), bytes
  virtual void transpose(void* dst, const void* src, int N, int C) = 0;
  virtual void update_scales(const Fp8ScalesArgs& a) = 0;
};

}  // namespace gpt
