#include "model/fp8_recipe.hpp"

#include <cstring>

namespace gpt {

Fp8Recipe::Fp8Recipe(Backend& be, int n_layer, const Fp8Options& o)
    : be_(be), o_(o), n_(n_layer * kProducts * kRoles) {
  if (!be.fp8())
    throw Error(kExitBadInput, "training.precision fp8: " + be.hardware() + " (" + be.name() +
                                   " backend) has no FP8 products; they need a GPU of compute capability 8.9 or "
                                   "later (Ada, Hopper), or the CPU emulation (training.device: cpu)");
  constexpr int S = fp8::kScaleInvStride;
  const size_t floats = size_t(n_) * (3 + S + o.history);
  dev_ = static_cast<float*>(be.alloc(floats * sizeof(float) + sizeof(unsigned)));
  scale_inv_ = dev_;  // first: 16-byte aligned like the allocation
  amax_ = dev_ + S * n_, scale_ = amax_ + n_, maxval_ = scale_ + n_, history_ = maxval_ + n_;
  saturated_ = reinterpret_cast<unsigned*>(dev_ + floats);
  std::vector<float> init(floats, 0.0f);
  for (int i = 0; i < n_; ++i) {
    const bool grad = i % kRoles == kGrad;
    init[size_t(S) * i] = init[size_t(S + 1) * n_ + i] = 1.0f;  // scale 1 until calibrated
    init[size_t(S + 2) * n_ + i] = fp8::max_finite(grad ? o.grad : Fp8Format::E4M3);
  }
  be.copy_h2d(dev_, init.data(), floats * sizeof(float));
  be.zero(saturated_, sizeof(unsigned));
}

Fp8Recipe::~Fp8Recipe() { be_.free(dev_); }

Fp8Tensor Fp8Recipe::tensor(int layer, Product p, Role r, void* data, bool record) const {
  const int i = slot(layer, p, r);
  Fp8Tensor t;
  t.data = data;
  t.scale = scale_ + i;
  t.scale_inv = scale_inv_ + size_t(i) * fp8::kScaleInvStride;
  t.amax = record ? amax_ + i : nullptr;
  t.fmt = r == kGrad ? o_.grad : Fp8Format::E4M3;
  return t;
}

void Fp8Recipe::end_step(Communicator* comm) {
  if (comm && comm->world() > 1) {
    comm->all_reduce_max(amax_, size_t(n_));
    comm->join();
  }
  Fp8ScalesArgs a;
  a.amax = amax_, a.history = history_, a.scale = scale_, a.scale_inv = scale_inv_, a.maxval = maxval_;
  a.saturated = saturated_, a.n = n_, a.H = o_.history, a.row = int(steps_ % o_.history);
  be_.fp8()->update_scales(a);
  ++steps_;
}

unsigned Fp8Recipe::take_saturated() {
  unsigned s = 0;
  be_.copy_d2h(&s, saturated_, sizeof s);
  be_.zero(saturated_, sizeof(unsigned));
  return s;
}

void Fp8Recipe::reset_amax() { be_.zero(amax_, sizeof(float) * n_); }

std::string Fp8Recipe::describe() const {
  return std::string("e4m3 inputs and weights, ") + fp8_format_name(o_.grad) +
         " gradients, delayed scaling over " + std::to_string(o_.history) + " steps, " + std::to_string(n_) +
         " scaled tensors";
}

std::vector<float> Fp8Recipe::state() const {
  std::vector<float> s(1 + size_t(n_) * (1 + o_.history));
  s[0] = float(steps_);
  be_.copy_d2h(s.data() + 1, scale_, sizeof(float) * n_);
  be_.copy_d2h(s.data() + 1 + n_, history_, sizeof(float) * n_ * o_.history);
  return s;
}

void Fp8Recipe::set_state(const std::vector<float>& s) {
  const size_t want = 1 + size_t(n_) * (1 + o_.history);
  if (s.size() != want)
    throw Error(kExitBadInput, "the checkpoint's FP8 state holds " + std::to_string(s.size()) + " values, this run's " +
                                   std::to_string(want) + " (a different model or training.fp8_amax_history)");
  steps_ = int64_t(s[0]);
  std::vector<float> inv(size_t(n_) * fp8::kScaleInvStride, 0.0f);
  for (int i = 0; i < n_; ++i) inv[size_t(i) * fp8::kScaleInvStride] = 1.0f / s[1 + i];
  be_.copy_h2d(scale_, s.data() + 1, sizeof(float) * n_);
  be_.copy_h2d(scale_inv_, inv.data(), sizeof(float) * inv.size());
  be_.copy_h2d(history_, s.data() + 1 + n_, sizeof(float) * n_ * o_.history);
  be_.zero(amax_, sizeof(float) * n_);
}

}  // namespace gpt
