#include "optim/optimizer.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include "base/format.hpp"
#include "optim/step.hpp"

namespace gpt {

namespace {

template <class Rule>
OptimizerInfo info_of() {
  static_assert(std::size(Rule::kHypers) <= optim::kMaxHypers, "raise optim::kMaxHypers");
  OptimizerInfo o{Rule::kName, std::vector<std::string>(Rule::kSlotNames, Rule::kSlotNames + Rule::kSlots),
                  Rule::kDoc, {}};
  for (const optim::HyperDecl& d : Rule::kHypers) o.hypers.push_back(d.name);
  return o;
}

// The rule's hyperparameters from the config's values, a name not given taking its declared default.
template <class Rule>
void bind_hypers(const HyperValues& given, float* p) {
  int i = 0;
  for (const optim::HyperDecl& d : Rule::kHypers) {
    auto it = given.find(d.name);
    p[i++] = it == given.end() ? d.value : it->second;
  }
}

// An elementwise rule run by the backend's own stream (CPU loop or CUDA kernel), timed and checked as
// the backend's ops are (Backend::run_op).
template <class Rule>
class RuleOptimizer final : public Optimizer {
 public:
  RuleOptimizer(bool stochastic, optim::StateType state, const HyperValues& hypers)
      : info_(info_of<Rule>()), stochastic_(stochastic), state_(state) {
    bind_hypers<Rule>(hypers, hypers_);
  }
  const char* name() const override { return Rule::kName; }
  const std::vector<std::string>& slots() const override { return info_.slots; }
  optim::StateType state() const override { return state_; }
  bool slot_signed(int k) const override { return Rule::kSlotSigned[k]; }
  void update(Backend& be, const ParamRange& r, const OptimizerHyper& h) const override {
    const optim::StepArgs a = args(be, r, h);
    const bool cuda = be.name() == "cuda";
    be.run_op(Rule::kName, [&](void* stream) {
      if (cuda) optim::step_cuda<Rule>(a, stream);
      else optim::step_cpu<Rule>(a);
    });
  }
  void update_on_host(const ParamRange& r, const OptimizerHyper& h, HostForm form) const override {
    const optim::StepArgs a = args(form.bf16, r, h);
    if (form.cuda_kernel) optim::step_host<Rule>(a, r.device_aligned);
    else optim::step_cpu<Rule>(a);
  }

 private:
  optim::StepArgs args(const Backend& be, const ParamRange& r, const OptimizerHyper& h) const {
    return args(be.act_dtype() == DType::BF16, r, h);
  }
  optim::StepArgs args(bool bf16, const ParamRange& r, const OptimizerHyper& h) const {
    optim::StepArgs a;
    a.param = r.param, a.master = r.master, a.residual = r.residual, a.grad = r.grad, a.n = r.n;
    for (int k = 0; k < Rule::kSlots; ++k) {
      a.slot[k] = r.slot[k];
      a.scale[k] = r.scale[k];
      a.slot_signed[k] = Rule::kSlotSigned[k];
    }
    a.state = state_;
    optim::Hyper x;
    x.lr = h.lr;
    std::copy(hypers_, hypers_ + optim::kMaxHypers, x.p);
    x.step = h.step;
    x.weight_decay = 0.0f;
    a.h_rest = Rule::prepare(x);
    x.weight_decay = r.decay || state_ != optim::StateType::F32 ? h.weight_decay : 0.0f;
    a.h = Rule::prepare(x);
    a.n_decay = r.n_decay;
    a.grad_scale = h.grad_scale;
    a.seed = h.seed, a.index_offset = r.index_offset, a.nonfinite = r.nonfinite;
    a.stochastic = stochastic_;
    a.bf16 = bf16;
    return a;
  }

  OptimizerInfo info_;
  bool stochastic_;
  optim::StateType state_;
  float hypers_[optim::kMaxHypers] = {};  // the rule's kHypers, bound at construction
};

template <class Rule>
void add_hypers(std::vector<HyperInfo>& all) {
  for (const optim::HyperDecl& d : Rule::kHypers) {
    auto it = std::find_if(all.begin(), all.end(), [&](const HyperInfo& h) { return h.name == d.name; });
    const std::string meaning = std::string("`") + Rule::kName + "`: " + d.doc;
    if (it == all.end()) {
      HyperInfo h;
      h.name = d.name, h.key = std::string("training.") + d.name, h.value = d.value;
      h.lo = d.lo, h.hi = d.hi, h.lo_open = d.lo_open, h.doc = meaning;
      all.push_back(h);
    } else if (it->value != d.value || it->lo != d.lo || it->hi != d.hi || it->lo_open != d.lo_open) {
      throw std::logic_error(std::string("optimizer rules disagree on hyperparameter ") + d.name +
                             "'s default or range");
    } else {
      it->doc += "; " + meaning;
    }
  }
}

// Host memory aligned as the device's allocations (the update's vector paths), its pages written
struct HostArray {
  explicit HostArray(size_t bytes) : p(bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr) {
    if (bytes && !p)
      throw Error(kExitOutOfMemory, "out of host memory: timing the optimizer's host update (training.offload) needs " +
                                        std::to_string(bytes) + " more bytes");
    const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)  // the pages placed as the update's threads touch them
    for (int64_t c = 0; c < chunks; ++c)
      std::memset(static_cast<char*>(p) + c * kChunk, 0, std::min(kChunk, bytes - size_t(c) * kChunk));
  }
  static constexpr size_t kChunk = size_t(1) << 16;
  ~HostArray() { std::free(p); }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  void* p;
};

}  // namespace

double host_update_s_per_param(const Optimizer& opt, optim::MasterKind master, size_t n) {
  const optim::StateType st = opt.state();
  HostArray param(2 * n), grad(2 * n), master_w(master == optim::MasterKind::F32 ? 4 * n : 0),
      residual(master == optim::MasterKind::Compensated ? 2 * n : 0);
  std::vector<std::unique_ptr<HostArray>> codes, scales;
  ParamRange r;
  r.n = r.n_decay = n;
  r.decay = true;
  r.param = param.p, r.grad = grad.p, r.master = static_cast<float*>(master_w.p);
  r.residual = static_cast<uint16_t*>(residual.p);
  for (size_t k = 0; k < opt.slots().size(); ++k) {
    codes.push_back(std::make_unique<HostArray>(optim::state_type_size(st) * n));
    r.slot[k] = codes.back()->p;
    if (st == optim::StateType::Int8) {
      scales.push_back(std::make_unique<HostArray>(4 * optim::quant_blocks(n)));
      r.scale[k] = static_cast<float*>(scales.back()->p);
    }
  }
  // parameters and gradients of a trained model's magnitudes (bf16 bits), no two alike in a row
  auto* pw = static_cast<uint16_t*>(param.p);
  auto* gw = static_cast<uint16_t*>(grad.p);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < int64_t(n); ++j) {
    const size_t i = size_t(j);
    const auto hash = [](uint32_t x) { return float(int32_t(x * 2654435761u) >> 8) * (1.0f / 8388608.0f); };
    pw[i] = f32_to_bf16(0.02f * hash(uint32_t(i)));
    gw[i] = f32_to_bf16(1e-3f * hash(uint32_t(i) ^ 0x5bd1e995u));
    if (r.master) r.master[i] = bf16_to_f32(pw[i]);
  }
  unsigned nonfinite = 0;
  r.nonfinite = &nonfinite;
  r.device_aligned = true;
  OptimizerHyper h;
  h.lr = 1e-4f, h.weight_decay = 0.1f, h.seed = 1;
  double best = 0;
  for (int s = 0; s < 3; ++s) {
    h.step = s + 1;
    const auto t0 = std::chrono::steady_clock::now();
    opt.update_on_host(r, h, {true, true});
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s == 1 || (s == 2 && dt < best)) best = dt;
  }
  return best / double(std::max<size_t>(n, 1));
}

const std::vector<OptimizerInfo>& optimizers() {
#define GPT_INFO(R) info_of<optim::R>(),
  static const std::vector<OptimizerInfo> all = {GPT_OPTIMIZER_RULES(GPT_INFO)};
#undef GPT_INFO
  return all;
}

std::string HyperInfo::requirement() const {
  if (hi >= optim::kUnbounded) return (lo_open ? "must be > " : "must be >= ") + shortest(lo);
  return (lo_open ? "must be in (" : "must be in [") + shortest(lo) + ", " + shortest(hi) + ")";
}

bool HyperInfo::accepts(float x) const { return (lo_open ? x > lo : x >= lo) && x < hi; }

const std::vector<HyperInfo>& optimizer_hypers() {
  static const std::vector<HyperInfo> all = [] {
    std::vector<HyperInfo> v;
#define GPT_HYPERS(R) add_hypers<optim::R>(v);
    GPT_OPTIMIZER_RULES(GPT_HYPERS)
#undef GPT_HYPERS
    return v;
  }();
  return all;
}

HyperValues default_hypers() {
  HyperValues v;
  for (const HyperInfo& h : optimizer_hypers()) v[h.name] = h.value;
  return v;
}

const OptimizerInfo* find_optimizer(const std::string& name) {
  for (const OptimizerInfo& o : optimizers())
    if (o.name == name) return &o;
  return nullptr;
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, bool stochastic_rounding, optim::StateType state,
                                          const HyperValues& hypers) {
#define GPT_MAKE(R)           \
  if (name == optim::R::kName) \
    return std::make_unique<RuleOptimizer<optim::R>>(stochastic_rounding, state, hypers);
  GPT_OPTIMIZER_RULES(GPT_MAKE)
#undef GPT_MAKE
  std::string known;
  for (const OptimizerInfo& o : optimizers()) known += (known.empty() ? "" : ", ") + o.name;
  throw input_error("training.optimizer: '" + name + "' is not one of " + known);
}

}  // namespace gpt
