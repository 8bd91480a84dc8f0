// FP8 training's recipe and scaling state (training.precision fp8).
//
// The recipe is a value: the output gradients' format, the amax history length, the margin. The state
// is a registry of scaled tensors by name ("h3.qkv.input"): each layer that quantizes a tensor registers
// it when the model is built and asks for its Fp8Tensor when it quantizes; nothing else knows which
// tensors exist. A tensor is quantized with the scale derived from the largest amax of its last `history`
// steps (a power of two: fp8::scale_for); the kernel that writes it records this step's amax; end_step()
// folds the step in.
//
// The state (scales and histories) lives in the backend's memory and goes into checkpoints as named
// entries, so a resumed run quantizes exactly as the uninterrupted one would, and a checkpoint from a
// model with fewer scaled tensors still loads (the new ones start uncalibrated: see set_state).
// Across ranks the amaxes must agree before the scales are derived: the caller passes the max-reduction
// (the communicator's) to end_step.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace gpt {

struct Fp8Recipe {
  Fp8Format grad = Fp8Format::E5M2;  // output gradients' format (inputs and weights are E4M3)
  int history = 16;                  // amax history length, steps
  int margin = 0;                    // scales divided by 2^margin (headroom)
};

// The scaled tensors' names: "h<layer>.<product>.<role>", role input / weight / grad.
std::string fp8_tensor_name(int layer, const char* product, const char* role);

class Fp8Scaling {
 public:
  Fp8Scaling(Backend& be, const Fp8Recipe& r);
  ~Fp8Scaling();
  Fp8Scaling(const Fp8Scaling&) = delete;
  Fp8Scaling& operator=(const Fp8Scaling&) = delete;

  const Fp8Recipe& recipe() const { return r_; }
  // Registers a scaled tensor of this format (again: the same slot) and returns its slot. Registration
  // ends with allocate() (or the first call that needs the state), which allocates the state.
  int add(const std::string& name, Fp8Format fmt);
  void allocate();
  // The bytes allocate() takes for n scaled tensors with this history length
  static size_t state_bytes(size_t n, int history);
  // The scaled tensor of a slot with its bytes at `data`; record false: its amax is not recorded
  // (evaluation and recomputation quantize with the scales but leave the state alone)
  Fp8Tensor tensor(int slot, void* data, bool record = true);
  size_t size() const { return names_.size(); }

  // Whether every scale has been derived from measured amaxes (false until the first end_step, or for a
  // tensor a checkpoint had no state for)
  bool calibrated() const { return steps_ > 0 && uncalibrated_.empty(); }
  int64_t steps() const { return steps_; }  // end_step calls so far: the scales change with it
  // Changes whenever any scale may have changed (end_step, set_state; also the calibration of tensors a
  // checkpoint had no state for, which leaves steps() as it was): FP8 copies cast with the scales are
  // valid while it stays the same
  uint64_t scales_version() const { return scales_version_; }
  // A max-reduction over ranks of n floats in the backend's memory, or an empty function on one rank.
  using ReduceMax = std::function<void(float* buf, size_t n)>;
  // Folds this step's amaxes into the histories and derives the next step's scales (collective through
  // reduce_max when given).
  void end_step(const ReduceMax& reduce_max);
  // Scaled tensors that saturated (amax above what their scale allowed) since the last call; synchronises
  unsigned take_saturated();
  // Forgets the amaxes recorded since the last end_step (passes that were not training steps)
  void reset_amax();
  // "e4m3 inputs and weights, e5m2 gradients, delayed scaling over 16 steps, 576 scaled tensors"
  std::string describe() const;

  // Checkpointed state, by name.
  struct State {
    int64_t steps = 0;
    int history = 0;                  // H
    std::vector<std::string> names;   // n
    std::vector<float> scale;         // (n)
    std::vector<float> amax_history;  // (H, n)
    bool empty() const { return names.empty(); }
  };
  State state();
  // Takes the entries whose names this run has (the history length must match); tensors without an
  // entry start uncalibrated and are calibrated by the next calibration passes. Returns the names of
  // entries this run has no tensor for (ignored).
  std::vector<std::string> set_state(const State& s);
  // Calibration passes for tensors without state: after them only those tensors' scales are derived
  // from the amaxes the passes recorded; every other tensor's state is left as it was.
  void end_calibration_step(const ReduceMax& reduce_max);
  void calibration_done() { uncalibrated_.clear(); }

 private:
  Backend& be_;
  Fp8Recipe r_;
  std::vector<std::string> names_;
  std::vector<Fp8Format> formats_;
  std::vector<int> uncalibrated_;  // slots with no state yet when the others have some
  int64_t steps_ = 0;
  uint64_t scales_version_ = 0;
  float* dev_ = nullptr;  // one allocation: scale_inv (n, strided), amax, scale, maxval (n), history (H x n)
  float *amax_ = nullptr, *scale_ = nullptr, *scale_inv_ = nullptr, *maxval_ = nullptr, *history_ = nullptr;
  unsigned* saturated_ = nullptr;
};

}  // namespace gpt
