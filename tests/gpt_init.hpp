// Inputs for whole-step tests of a small GPT-2: initial parameters by bucket and random token ids.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "model/params.hpp"

namespace gpt::tests {

// x rounded to the nearest bf16 value (ties to even), as the GPU's fp32 -> bf16 conversion
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// Normal(0, 0.05) everywhere, LayerNorm weights around 1, the vocabulary's padding rows of wte 0; each
// value passed through `round` when given (so that every backend starts from identical values).
inline std::vector<std::vector<float>> initial_params(const ParamLayout& L, std::mt19937_64& rng,
                                                      float (*round)(float) = nullptr) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<std::vector<float>> init(L.n_buckets());
  for (int k = 0; k < L.n_buckets(); ++k) {
    init[k].assign(L.bucket(k).size, 0.0f);
    for (auto& t : L.bucket(k).tensors)
      for (size_t i = 0; i < t.numel; ++i) {
        float v = nd(rng) + (t.spec->init == Init::ones ? 1.0f : 0.0f);
        if (i >= t.real_numel) v = 0.0f;  // vocabulary padding rows
        init[k][t.offset + i] = round ? round(v) : v;
      }
  }
  return init;
}

inline std::vector<int> random_tokens(size_t n, int vocab, std::mt19937_64& rng) {
  std::vector<int> v(n);
  for (auto& x : v) x = int(rng() % uint64_t(vocab));
  return v;
}

}  // namespace gpt::tests
