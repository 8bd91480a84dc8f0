// The MLP's activations (model.activation, base/common.hpp's Activation) as host and device code alike:
// the one place their math is written for every backend, the CPU reference, the CUDA kernels and both
// FP8 casts. GELU keeps its two forms: the tanh form on values (as GPT-2 and cuBLASLt's epilogue compute
// it: backend/cpu/gelu.hpp, kernels/activation.cu) and the logistic form in the FP8 casts
// (base/gelu_logistic.hpp); relu2 has one. A new activation is its two functions here, its name in
// Activation, and a case in each switch below.
#pragma once
#include "base/common.hpp"
#include "base/gelu_logistic.hpp"

#if defined(__CUDACC__)
#define GPT_ACT_HD __host__ __device__ __forceinline__
#else
#define GPT_ACT_HD inline
#endif

namespace gpt {

// relu2(x) = max(x, 0)^2 and its derivative 2 max(x, 0); NaN passes through both, as PyTorch's ReLU's
GPT_ACT_HD float relu2(float x) {
  const float r = x < 0.0f ? 0.0f : x;
  return r * r;
}
GPT_ACT_HD float relu2_grad(float x) { return x < 0.0f ? 0.0f : 2.0f * x; }

// What the op profile calls an activation's ops: alone, and in an FP8 cast
struct ActivationOpNames {
  const char *fwd, *bwd, *cast, *cast_grad;
};
inline const ActivationOpNames& activation_op_names(Activation a) {
  static constexpr ActivationOpNames kNames[] = {{"gelu_fwd", "gelu_bwd", "fp8_cast +gelu", "fp8_cast +dgelu"},
                                                 {"relu2_fwd", "relu2_bwd", "fp8_cast +relu2", "fp8_cast +drelu2"}};
  return kNames[int(a)];
}

// The activation and its derivative as the FP8 casts apply them (GELU in its logistic form)
GPT_ACT_HD float activation_cast(Activation a, float x) {
  return a == Activation::relu2 ? relu2(x) : gelu_logistic(x);
}
GPT_ACT_HD float activation_cast_grad(Activation a, float x) {
  return a == Activation::relu2 ? relu2_grad(x) : gelu_logistic_grad(x);
}

}  // namespace gpt
