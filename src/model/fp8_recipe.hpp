// FP8 training's recipe and state (training.precision fp8): which tensors are scaled, in which format,
// and their delayed scaling. Each of a layer's four block products (qkv, attention projection, fc, fc
// projection) has three scaled tensors: its input and weight (E4M3) and its output gradient
// (training.fp8_grad_format). A tensor is quantized with the scale derived from the largest amax of the
// last fp8_amax_history steps (a power of two: fp8::scale_for); the kernel that writes it records this
// step's amax; end_step() folds the step in (all ranks agree: the amaxes are max-reduced first).
//
// The state (scales and histories) lives in the backend's memory and goes into checkpoints, so a resumed
// run quantizes exactly as the uninterrupted one would. A run's first step has no history: it starts
// from one calibration pass whose gradients are thrown away (run/trainer.cpp), which fills the amaxes.
#pragma once
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "dist/comm.hpp"

namespace gpt {

struct Fp8Options {
  Fp8Format grad = Fp8Format::E5M2;  // output gradients' format
  int history = 16;                  // amax history length, steps
};

class Fp8Recipe {
 public:
  enum Product : int { kQkv, kAttProj, kFc, kFcProj, kProducts };
  enum Role : int { kInput, kWeight, kGrad, kRoles };

  Fp8Recipe(Backend& be, int n_layer, const Fp8Options& o);
  ~Fp8Recipe();
  Fp8Recipe(const Fp8Recipe&) = delete;
  Fp8Recipe& operator=(const Fp8Recipe&) = delete;

  // The scaled tensor (layer, product, role) with its bytes at `data`; record false: its amax is not
  // recorded (evaluation and recomputation quantize with the scales but leave the state alone)
  Fp8Tensor tensor(int layer, Product p, Role r, void* data, bool record = true) const;
  // Whether the scales have been derived from measured amaxes (false until the first end_step)
  bool calibrated() const { return steps_ > 0; }
  int64_t steps() const { return steps_; }  // end_step calls so far: the scales change with it
  // Collective when comm is given (several ranks): folds this step's amaxes into the histories and
  // derives the next step's scales.
  void end_step(Communicator* comm);
  // Scaled tensors that saturated (amax above what their scale allowed) since the last call; synchronises
  unsigned take_saturated();
  // Forgets the amaxes recorded since the last end_step (passes that were not training steps)
  void reset_amax();
  // "e4m3 inputs and weights, e5m2 gradients, delayed scaling over 16 steps, 576 scaled tensors"
  std::string describe() const;

  // Checkpointed state: [steps, scales (n), histories (H x n)]; set_state checks the shape.
  std::vector<float> state() const;
  void set_state(const std::vector<float>& s);

 private:
  int slot(int layer, Product p, Role r) const { return (layer * kProducts + p) * kRoles + r; }
  Backend& be_;
  Fp8Options o_;
  int n_ = 0;
  int64_t steps_ = 0;
  float* dev_ = nullptr;      // one allocation: scale_inv (n, strided), amax, scale, maxval (n), history (H x n)
  float *amax_, *scale_, *scale_inv_, *maxval_, *history_;
  unsigned* saturated_ = nullptr;
};

}  // namespace gpt
