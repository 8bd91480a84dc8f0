// GELU (tanh approximation) and its derivative through the logistic function, for host and device code
// alike. With u = k (x + a x^3): 0.5 (1 + tanh u) = sigmoid(2u) = s and 0.5 (1 - tanh u) = e s with
// e = exp(-2u), so gelu(x) = x s and gelu'(x) = s (1 + 2 k x (1 + 3 a x^2) e s): one exponential and one
// reciprocal, and no term cancels (the tanh form's 1 + tanh u loses its digits where tanh u nears -1, in
// the negative tail, where the value is then wrong by far more than its last bit). The FP8 casts that
// apply GELU use these on both backends, so the CPU emulation and the CUDA kernel quantize the same
// values up to the device's approximate exponential and reciprocal. e is capped (x below about -10) so
// that e s stays finite.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define GPT_GELU_HD __host__ __device__ __forceinline__
#else
#define GPT_GELU_HD inline
#endif

namespace gpt {

// gelu(x) = 0.5 x (1 + tanh(kGeluScale (x + kGeluCubic x^3)))
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

struct GeluTerms {
  float s, es;  // sigmoid(2u), sigmoid(-2u)
};

GPT_GELU_HD GeluTerms gelu_logistic_terms(float x, float x2) {
  const float arg = fminf(-2.0f * kGeluScale * x * (1.0f + kGeluCubic * x2), 80.0f);
#if defined(__CUDA_ARCH__)
  const float e = __expf(arg);
  const float s = __fdividef(1.0f, 1.0f + e);
#else
  const float e = std::exp(arg);
  const float s = 1.0f / (1.0f + e);
#endif
  return {s, e * s};
}
GPT_GELU_HD float gelu_logistic(float x) { return x * gelu_logistic_terms(x, x * x).s; }
GPT_GELU_HD float gelu_logistic_grad(float x) {
  const float x2 = x * x;
  const GeluTerms g = gelu_logistic_terms(x, x2);
  return g.s * (1.0f + 2.0f * kGeluScale * x * (1.0f + 3.0f * kGeluCubic * x2) * g.es);
}

}  // namespace gpt
