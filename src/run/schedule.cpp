#include "run/schedule.hpp"

#include <cmath>

namespace gpt {

double lr_at(const TrainingConfig& t, int step) {
  const double max_lr = t.lr, min_lr = t.lr * double(t.min_lr_frac);
  if (step < t.warmup_steps) return max_lr * (step + 1) / t.warmup_steps;
  const int decay_steps = t.steps - t.warmup_steps;
  const double p = decay_steps > 1 ? double(step - t.warmup_steps) / (decay_steps - 1) : 1.0;
  if (t.schedule == Schedule::constant) return max_lr;
  if (t.schedule == Schedule::linear) return max_lr - (max_lr - min_lr) * p;
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

float clip_scale(double norm, float clip) { return (clip > 0 && norm > clip) ? float(clip / norm) : 1.0f; }

}  // namespace gpt
