// GELU (tanh approximation) and its derivative in fp32, as the CPU backend computes them.
#pragma once
#include <cmath>

#include "base/gelu_logistic.hpp"  // kGeluScale, kGeluCubic

namespace gpt::cpu {

inline float gelu(float x) {
  float cube = kGeluCubic * x * x * x;
  return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + cube)));
}
inline float gelu_grad(float x) {
  float cube = kGeluCubic * x * x * x;
  float t = std::tanh(kGeluScale * (x + cube));
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

}  // namespace gpt::cpu
