// The FP8 ops' descriptors (training.precision fp8): the casts that make a product's FP8 operands, the
// byte transpose, and the end of a step's delayed scaling (the recipe and its state:
// model/fp8_scaling.hpp). The products themselves are Backend::matmul_fwd and matmul_bwd with FP8
// `Operand`s; a norm writes FP8 through NormFwd::q, the classifier's gradient through
// ClassifierLoss::dlogits. Backend runs each descriptor (fp8_cast, fp8_quantize, fp8_transpose,
// fp8_update_scales) where supports_fp8() says it can. Conventions as in backend.hpp, and:
// - `x` tensors are the backend's activation dtype; FP8 tensors are bytes (Fp8Tensor::data).
// - Quantizing x gives q = fp8(x * scale) (nearest even, saturating at the format's largest value) and
//   folds max |x| into *amax, in the kernel that writes q; the products multiply by scale_inv.
// - "_t" tensors hold a matrix transposed: (C, N) bytes for an (N, C) tensor. The weight-gradient
//   product needs both of its operands transposed (FP8 tensor cores take K-major operands only).
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/common.hpp"
#include "base/fp8.hpp"

namespace gpt {

// An FP8 tensor as an op writes or reads it: its bytes and its scaling state (one scale per tensor)
struct Fp8Tensor {
  void* data = nullptr;             // FP8 bytes
  const float* scale = nullptr;     // (1) multiplies x before the rounding to FP8
  const float* scale_inv = nullptr; // (1) 1 / scale: dequantizes; 16-byte aligned (cuBLASLt reads it)
  float* amax = nullptr;            // (1) max |x| is folded in here; nullable (not recorded)
  Fp8Format fmt = Fp8Format::E4M3;
};

// A cast of v over rows of C features into q.data (N, C) and/or q_t (C, N) (either nullable):
//   apply none:     v = x
//   apply act:      v = act(x), x a product's output before the MLP's activation: the activation's output
//                   for the next product, the same bytes wherever it is made (the forward, or
//                   recomputation in the backward)
//   apply act_grad: v = x * act'(act_in), x the gradient of the activation's output
// colsum (C, fp32, nullable; not with `act`) is overwritten with the column sums of v before rounding:
// the bias gradient of the product whose output gradient v is. The activation is computed as
// base/activation.hpp's activation_cast does (GELU in its logistic form), on every backend.
struct Fp8Cast {
  enum class Apply { none, act, act_grad };
  Fp8Tensor q;
  void* q_t = nullptr;
  const void* x = nullptr;
  Apply apply = Apply::none;
  Activation act = Activation::gelu;
  const void* act_in = nullptr;  // (N, C) act_grad's activation input
  float* colsum = nullptr;
  int N = 0, C = 0;
  // what is wrong with the descriptor's fields ("" when nothing): every backend checks it first
  const char* invalid() const {
    if (apply == Apply::act_grad && !act_in) return "act_grad without act_in";
    if (apply != Apply::act_grad && act_in) return "act_in without act_grad";
    if (apply == Apply::act && colsum) return "column sums of an activation's output";
    if (!q.data && !q_t) return "no output";
    return "";
  }
};

// n consecutive elements x (no layout: a piece of a weight, quantized where it is kept) into q.data (n),
// max |x| folded into *q.amax: the bytes an Fp8Cast of the whole tensor gives those elements.
struct Fp8Quantize {
  Fp8Tensor q;
  const void* x = nullptr;
  size_t n = 0;
};

// dst (C, N) = src (N, C), bytes
struct Fp8Transpose {
  void* dst = nullptr;
  const void* src = nullptr;
  int N = 0, C = 0;
};

// The end of a step under delayed scaling, for n scaled tensors with H-deep amax histories: slot
// `row` of the history takes this step's amax; a tensor whose amax exceeded maxval / scale (values were
// clipped) adds 1 to *saturated; each scale becomes fp8::scale_for(max over the history); amax is reset.
struct Fp8UpdateScales {
  float* amax = nullptr;         // (n)
  float* history = nullptr;      // (H, n)
  float* scale = nullptr;        // (n)
  float* scale_inv = nullptr;    // (n, every fp8::kScaleInvStride-th float)
  const float* maxval = nullptr; // (n) the largest finite value of each tensor's format
  unsigned* saturated = nullptr; // (1) accumulated
  int n = 0, H = 0, row = 0;
  int margin = 0;                // headroom: each scale divided by 2^margin
};

}  // namespace gpt
