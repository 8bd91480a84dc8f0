// FP8 casts (fp8_cast.cu): a tensor quantized with its per-tensor scale, row-major and/or transposed in
// one pass, its amax folded in, optionally through the MLP's activation or its derivative and with its column sums (a
// bias gradient); the byte transpose; the delayed-scaling update at a step's end. Scales and amaxes are
// device pointers (base/fp8_math.hpp has the rule the scales follow).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "base/common.hpp"
#include "base/fp8_math.hpp"

namespace gpt::kern {

// What a cast quantizes: v = x; v = act(x) (x a product's output before the activation); or v = x *
// act'(act_in) (x the gradient of the activation's output); act GELU (logistic form) or relu2
// (base/activation.hpp)
enum class Fp8CastAct { kNone, kGelu, kGeluGrad, kRelu2, kRelu2Grad };
// The kernel's name for applying activation `a` (grad: its derivative), as Fp8Cast says it
constexpr Fp8CastAct fp8_cast_act(Activation a, bool grad) {
  if (a == Activation::relu2) return grad ? Fp8CastAct::kRelu2Grad : Fp8CastAct::kRelu2;
  return grad ? Fp8CastAct::kGeluGrad : Fp8CastAct::kGelu;
}
template <class X>
struct Fp8CastArgs {
  const X* x = nullptr;        // (N, C)
  Fp8CastAct act = Fp8CastAct::kNone;
  const X* act_in = nullptr;   // (N, C) with kGeluGrad, kRelu2Grad: the activation's input
  uint8_t* out = nullptr;      // (N, C) or null
  uint8_t* out_t = nullptr;    // (C, N) or null
  const float* scale = nullptr;
  float* amax = nullptr;       // or null
  fp8::Format fmt = fp8::Format::E4M3;
  float* colsum = nullptr;     // (C) or null: overwritten with the column sums of v (fp32, deterministic)
  float* scratch = nullptr;    // fp8_cast_scratch_bytes(N, C) bytes when colsum is set
  int N = 0, C = 0;            // C a multiple of 8, N of 8
};
size_t fp8_cast_scratch_bytes(int N, int C);
template <class X>
void fp8_cast(const Fp8CastArgs<X>& a, cudaStream_t s);

// out (n) = fp8(x * scale), max |x| folded into *amax (nullable): n consecutive elements, no layout
void fp8_quantize(uint8_t* out, const bf16* x, size_t n, const float* scale, float* amax, fp8::Format fmt,
                  cudaStream_t s);
// dst (C, N) = src (N, C), bytes; N and C multiples of 8
void fp8_transpose(uint8_t* dst, const uint8_t* src, int N, int C, cudaStream_t s);
// *amax = max(*amax, *slot) (a NaN in slot counts as infinity): an amax a library wrote for one call,
// folded into the tensor's amax of the step
void fp8_fold_amax(float* amax, const float* slot, cudaStream_t s);

struct Fp8ScalesLaunch {
  float* amax = nullptr;          // (n)
  float* history = nullptr;       // (H, n)
  float* scale = nullptr;         // (n)
  float* scale_inv = nullptr;     // (n, every fp8::kScaleInvStride-th float)
  const float* maxval = nullptr;  // (n)
  unsigned* saturated = nullptr;  // (1) += tensors whose amax * scale exceeded maxval
  int n = 0, H = 0, row = 0;
  int margin = 0;                 // scales divided by 2^margin (fp8::scale_for)
};
void fp8_update_scales(const Fp8ScalesLaunch& a, cudaStream_t s);

// dst (n, X) += sums (n, fp32)
template <class X>
void add_sums(X* dst, const float* sums, int n, cudaStream_t s);

}  // namespace gpt::kern
