// The learning-rate schedule and gradient clipping.
#pragma once
#include "config/config.hpp"

namespace gpt {
double lr_at(const TrainingConfig& t, int step);  // step is 0-based
// Factor applied to every gradient so that the global L2 norm is at most clip (clip 0: off).
float clip_scale(double norm, float clip);
}  // namespace gpt
