// One row of the fused softmax + cross-entropy on the CPU, shared by the classifier (backend_cpu.cpp) and
// its FP8 emulation (fp8_cpu.cpp), so that both compute the same bits: returns the row's loss over the V
// real of its Vp logits z; with g non-null (it may be z itself) writes the loss's gradient there,
// dloss * (softmax(z) - onehot(target)) and zeros over the padding.
#pragma once
#include <algorithm>
#include <cmath>

namespace gpt::cpu {

inline float xent_row(const float* z, float* g, int V, int Vp, int target, float dloss) {
  float mx = -INFINITY;
  for (int j = 0; j < V; ++j) mx = std::max(mx, z[j]);
  const float target_logit = z[target];  // before g, which may be z, is written
  double sum = 0;
  if (g) {
    for (int j = 0; j < V; ++j) {  // keep exp(z - max) for the gradient
      g[j] = std::exp(z[j] - mx);
      sum += g[j];
    }
    const float scale = float(dloss / sum);
    for (int j = 0; j < V; ++j) g[j] *= scale;
    g[target] -= dloss;
    for (int j = V; j < Vp; ++j) g[j] = 0;
  } else {
    for (int j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
  }
  return mx + float(std::log(sum)) - target_logit;
}

}  // namespace gpt::cpu
