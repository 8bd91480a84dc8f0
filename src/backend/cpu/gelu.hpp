// GELU (tanh approximation) and its derivative in fp32, as the CPU backend computes them.
#pragma once
#include <cmath>

namespace gpt::cpu {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

inline float gelu(float x) {
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + cube)));
}
inline float gelu_grad(float x) {
  float cube = 0.044715f * x * x * x;
  float t = std::tanh(kGeluScale * (x + cube));
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace gpt::cpu
