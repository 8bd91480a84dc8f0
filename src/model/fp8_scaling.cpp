#include "model/fp8_scaling.hpp"

#include <algorithm>
#include <unordered_map>

namespace gpt {

std::string fp8_tensor_name(int layer, const char* product, const char* role) {
  return "h" + std::to_string(layer) + "." + product + "." + role;
}

Fp8Scaling::Fp8Scaling(Backend& be, const Fp8Recipe& r) : be_(be), r_(r) {
  if (const std::string why = be.supports_fp8(); !why.empty())
    throw Error(kExitBadInput, "training.precision fp8: " + why + "; FP8 needs a GPU of compute capability 8.9 or "
                                   "later (Ada, Hopper) in bf16, or the CPU emulation (training.device: cpu)");
}

Fp8Scaling::~Fp8Scaling() {
  if (dev_) be_.free(dev_);
}

int Fp8Scaling::add(const std::string& name, Fp8Format fmt) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return int(i);
  if (dev_) throw Error(kExitFailure, "internal error: FP8 tensor '" + name + "' registered after the state exists");
  names_.push_back(name);
  formats_.push_back(fmt);
  return int(names_.size()) - 1;
}

size_t Fp8Scaling::state_bytes(size_t n, int history) {
  return n * (3 + fp8::kScaleInvStride + size_t(history)) * sizeof(float) + sizeof(unsigned);
}

void Fp8Scaling::allocate() {
  if (dev_) return;
  constexpr int S = fp8::kScaleInvStride;
  const size_t n = names_.size(), floats = n * (3 + S + size_t(r_.history));
  dev_ = static_cast<float*>(be_.alloc(state_bytes(n, r_.history)));
  scale_inv_ = dev_;  // first: 16-byte aligned like the allocation
  amax_ = dev_ + S * n, scale_ = amax_ + n, maxval_ = scale_ + n, history_ = maxval_ + n;
  saturated_ = reinterpret_cast<unsigned*>(dev_ + floats);
  std::vector<float> init(floats, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    init[size_t(S) * i] = init[size_t(S + 1) * n + i] = 1.0f;  // scale 1 until calibrated
    init[size_t(S + 2) * n + i] = fp8::max_finite(formats_[i]);
  }
  be_.copy_h2d(dev_, init.data(), floats * sizeof(float));
  be_.zero(saturated_, sizeof(unsigned));
}

Fp8Tensor Fp8Scaling::tensor(int slot, void* data, bool record) {
  allocate();
  Fp8Tensor t;
  t.data = data;
  t.scale = scale_ + slot;
  t.scale_inv = scale_inv_ + size_t(slot) * fp8::kScaleInvStride;
  t.amax = record ? amax_ + slot : nullptr;
  t.fmt = formats_[slot];
  return t;
}

void Fp8Scaling::end_step(const ReduceMax& reduce_max) {
  allocate();
  if (reduce_max) reduce_max(amax_, names_.size());
  Fp8UpdateScales a;
  a.amax = amax_, a.history = history_, a.scale = scale_, a.scale_inv = scale_inv_, a.maxval = maxval_;
  a.saturated = saturated_, a.n = int(names_.size()), a.H = r_.history, a.row = int(steps_ % r_.history);
  a.margin = r_.margin;
  be_.fp8_update_scales(a);
  ++steps_;
  ++scales_version_;
}

void Fp8Scaling::end_calibration_step(const ReduceMax& reduce_max) {
  if (steps_ == 0 || uncalibrated_.empty()) return end_step(reduce_max);  // every tensor is new
  // Only the tensors a checkpoint had no state for learn from this pass: the others get theirs back.
  const State keep = state();
  end_step(reduce_max);
  State now = state();
  std::vector<char> fresh(names_.size(), 0);
  for (int i : uncalibrated_) fresh[i] = 1;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (fresh[i]) continue;
    now.scale[i] = keep.scale[i];
    for (int h = 0; h < r_.history; ++h) now.amax_history[h * names_.size() + i] = keep.amax_history[h * names_.size() + i];
  }
  now.steps = keep.steps;
  const std::vector<int> pending = uncalibrated_;
  set_state(now);
  uncalibrated_ = pending;
}

unsigned Fp8Scaling::take_saturated() {
  allocate();
  unsigned s = 0;
  be_.copy_d2h(&s, saturated_, sizeof s);
  be_.zero(saturated_, sizeof(unsigned));
  return s;
}

void Fp8Scaling::reset_amax() {
  allocate();
  be_.zero(amax_, sizeof(float) * names_.size());
}

std::string Fp8Scaling::describe() const {
  std::string s = std::string("e4m3 inputs and weights, ") + fp8_format_name(r_.grad) +
                  " gradients, delayed scaling over " + std::to_string(r_.history) + " steps";
  if (r_.margin) s += ", margin " + std::to_string(r_.margin);
  return s + ", " + std::to_string(names_.size()) + " scaled tensors";
}

Fp8Scaling::State Fp8Scaling::state() {
  allocate();
  const size_t n = names_.size();
  State s;
  s.steps = steps_;
  s.history = r_.history;
  s.names = names_;
  s.scale.resize(n);
  s.amax_history.resize(n * size_t(r_.history));
  be_.copy_d2h(s.scale.data(), scale_, sizeof(float) * n);
  be_.copy_d2h(s.amax_history.data(), history_, sizeof(float) * s.amax_history.size());
  return s;
}

std::vector<std::string> Fp8Scaling::set_state(const State& s) {
  allocate();
  if (s.history != r_.history)
    throw Error(kExitBadInput, "the checkpoint's FP8 state has an amax history of " + std::to_string(s.history) +
                                   " steps, this run's training.fp8_amax_history is " + std::to_string(r_.history));
  const size_t n = names_.size(), m = s.names.size();
  std::unordered_map<std::string, size_t> at;
  for (size_t j = 0; j < m; ++j) at[s.names[j]] = j;
  std::vector<float> scale(n, 1.0f), hist(n * size_t(r_.history), 0.0f);
  std::vector<float> inv(n * fp8::kScaleInvStride, 0.0f);
  uncalibrated_.clear();
  for (size_t i = 0; i < n; ++i) {
    auto it = at.find(names_[i]);
    if (it == at.end()) {
      uncalibrated_.push_back(int(i));
    } else {
      scale[i] = s.scale[it->second];
      for (int h = 0; h < r_.history; ++h) hist[h * n + i] = s.amax_history[h * m + it->second];
      at.erase(it);
    }
    inv[i * fp8::kScaleInvStride] = 1.0f / scale[i];
  }
  steps_ = s.steps;
  ++scales_version_;
  be_.copy_h2d(scale_, scale.data(), sizeof(float) * n);
  be_.copy_h2d(scale_inv_, inv.data(), sizeof(float) * inv.size());
  be_.copy_h2d(history_, hist.data(), sizeof(float) * hist.size());
  be_.zero(amax_, sizeof(float) * n);
  std::vector<std::string> unused;
  for (auto& [name, j] : at) unused.push_back(name);
  std::sort(unused.begin(), unused.end());
  return unused;
}

}  // namespace gpt
