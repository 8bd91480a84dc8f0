#include "optim/optimizer.hpp"

#include "optim/step.hpp"

namespace gpt {

namespace {

template <class Rule>
OptimizerInfo info_of() {
  return {Rule::kName, std::vector<std::string>(Rule::kSlotNames, Rule::kSlotNames + Rule::kSlots), Rule::kDoc};
}

// An elementwise rule run by the backend's own stream (CPU loop or CUDA kernel), timed and checked as
// the backend's ops are (Backend::run_op).
template <class Rule>
class RuleOptimizer final : public Optimizer {
 public:
  RuleOptimizer(bool stochastic, optim::StateType state)
      : info_(info_of<Rule>()), stochastic_(stochastic), state_(state) {}
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
  void update_host(const Backend& be, const ParamRange& r, const OptimizerHyper& h) const override {
    const optim::StepArgs a = args(be, r, h);
    if (be.name() == "cuda") optim::step_host<Rule>(a, r.device_aligned);
    else optim::step_cpu<Rule>(a);
  }

 private:
  optim::StepArgs args(const Backend& be, const ParamRange& r, const OptimizerHyper& h) const {
    optim::StepArgs a;
    a.param = r.param, a.master = r.master, a.residual = r.residual, a.grad = r.grad, a.n = r.n;
    for (int k = 0; k < Rule::kSlots; ++k) {
      a.slot[k] = r.slot[k];
      a.scale[k] = r.scale[k];
      a.slot_signed[k] = Rule::kSlotSigned[k];
    }
    a.state = state_;
    optim::Hyper x;
    x.lr = h.lr, x.beta1 = h.beta1, x.beta2 = h.beta2, x.eps = h.eps;
    x.step = h.step;
    x.weight_decay = 0.0f;
    a.h_rest = Rule::prepare(x);
    x.weight_decay = r.decay || state_ != optim::StateType::F32 ? h.weight_decay : 0.0f;
    a.h = Rule::prepare(x);
    a.n_decay = r.n_decay;
    a.grad_scale = h.grad_scale;
    a.seed = h.seed, a.index_offset = r.index_offset, a.nonfinite = r.nonfinite;
    a.stochastic = stochastic_;
    a.bf16 = be.act_dtype() == DType::BF16;
    return a;
  }

  OptimizerInfo info_;
  bool stochastic_;
  optim::StateType state_;
};

}  // namespace

const std::vector<OptimizerInfo>& optimizers() {
#define GPT_INFO(R) info_of<optim::R>(),
  static const std::vector<OptimizerInfo> all = {GPT_OPTIMIZER_RULES(GPT_INFO)};
#undef GPT_INFO
  return all;
}

const OptimizerInfo* find_optimizer(const std::string& name) {
  for (const OptimizerInfo& o : optimizers())
    if (o.name == name) return &o;
  return nullptr;
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, bool stochastic_rounding, optim::StateType state) {
#define GPT_MAKE(R) \
  if (name == optim::R::kName) return std::make_unique<RuleOptimizer<optim::R>>(stochastic_rounding, state);
  GPT_OPTIMIZER_RULES(GPT_MAKE)
#undef GPT_MAKE
  std::string known;
  for (const OptimizerInfo& o : optimizers()) known += (known.empty() ? "" : ", ") + o.name;
  throw input_error("training.optimizer: '" + name + "' is not one of " + known);
}

}  // namespace gpt
