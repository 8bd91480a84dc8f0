// GPT-2's initialisation, a pure function of (seed, logical index): the same on any world size and on
// either backend (base/random.hpp).
#pragma once
#include <cstdint>

#include "backend/backend.hpp"
#include "model/params.hpp"

namespace gpt {
// dst (bucket b's size, fp32, memory of `be`) = bucket b's initial values: normal(0, std) weights (residual
// projections std / sqrt(2 n_layer)), LayerNorm gains 1, biases and vocabulary padding rows 0. Drawn by the
// backend: on a GPU, in milliseconds where the host took seconds.
void init_bucket(const ParamLayout& layout, int b, uint64_t seed, float std, Backend& be, float* dst);
}  // namespace gpt
