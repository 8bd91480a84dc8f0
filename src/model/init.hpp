// GPT-2's initialisation, a pure function of (seed, logical index): the same on any world size.
#pragma once
#include <cstdint>
#include <vector>

#include "model/params.hpp"

namespace gpt {
// out = bucket b's initial values: normal(0, std) weights (residual projections std / sqrt(2 n_layer)),
// LayerNorm gains 1, biases and vocabulary padding rows 0.
void init_bucket(const ParamLayout& layout, int b, uint64_t seed, float std, std::vector<float>& out);
}  // namespace gpt
