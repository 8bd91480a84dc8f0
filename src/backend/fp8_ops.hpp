// FP8 ops (training.precision fp8): the four block products of every layer and, with
// training.fp8_classifier, the classifier's three run on FP8 operands, one scale per tensor (delayed
// scaling; the recipe and its state: model/fp8_scaling.hpp). A backend offers them through
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
  // out (N, OC) = inp (N, IC) @ w (OC, IC)^T + bias (OC, nullable), fp32 accumulation, act dtype out.
  // With pre_gelu non-null: pre_gelu = that product, out = gelu_tanh(pre_gelu).
  virtual void matmul_fwd(void* out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias, int N, int IC,
                          int OC, void* pre_gelu) = 0;
  // The forward with GELU whose output goes to the next product in FP8: out.data (N, OC) =
  // fp8(gelu_tanh(inp @ w^T + bias) * out.scale), GELU computed from the fp32 product, max |gelu| folded
  // into *out.amax (nullable); pre_gelu (N, OC) = the product before GELU, act dtype. false: the backend
  // has no such fused product and wrote nothing (the caller takes matmul_fwd, then cast).
  virtual bool matmul_fwd_gelu_q(const Fp8Tensor& out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias,
                                 int N, int IC, int OC, void* pre_gelu) = 0;
  // dinp (N, IC) = dout (N, OC) @ w, from w_t = w transposed (IC, OC); overwrites. With pre_gelu (N, IC)
  // non-null it is multiplied by gelu_tanh'(pre_gelu) (a fused epilogue where the library has one).
  virtual void matmul_dinp(void* dinp, const Fp8Tensor& dout, const Fp8Tensor& w_t, int N, int IC, int OC,
                           const void* pre_gelu) = 0;
  // dw (OC, IC) += dout^T @ inp, from dout_t (OC, N) and inp_t (IC, N)
  virtual void matmul_dw(void* dw, const Fp8Tensor& dout_t, const Fp8Tensor& inp_t, int N, int IC, int OC) = 0;
  // dst (n, act dtype) += sums (n, fp32)
  virtual void add_sums(void* dst, const float* sums, int n) = 0;
  // Backend::classifier with the gradient in FP8: losses (N) fp32 = -log p[target] over logits (N, Vp)
  // of which the first V columns are real; the gradient (p - onehot(target)) * dloss (padded columns 0)
  // is quantized into dlogits.data (N, Vp) in the same pass, its amax recorded, always (zeros for
  // dloss = 0). The logits are only read.
  virtual void classifier(const void* logits, float* losses, const int* targets, int N, int V, int Vp,
                          float dloss, const Fp8Tensor& dlogits) = 0;
  virtual void update_scales(const Fp8ScalesArgs& a) = 0;
};

}  // namespace gpt
