#include <cmath>
#include <cstring>

#include "optim/step.hpp"

namespace gpt::optim {

// The CPU backend is fp32 throughout: no rounding of the parameters.
template <class Rule>
void step_cpu(const StepArgs& a) {
  float* p = a.master ? a.master : static_cast<float*>(a.param);
  const float* g = static_cast<const float*>(a.grad);
  unsigned bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t i = 0; i < a.n; ++i) {
    float s[Rule::kSlots];
    for (int k = 0; k < Rule::kSlots; ++k) s[k] = a.slot[k][i];
    p[i] = Rule::apply(p[i], g[i] * a.grad_scale, s, a.h);
    bool finite = std::isfinite(p[i]);
    for (int k = 0; k < Rule::kSlots; ++k) {
      a.slot[k][i] = s[k];
      finite = finite && std::isfinite(s[k]);
    }
    bad |= unsigned(!finite);
  }
  if (a.nonfinite && bad) *a.nonfinite = 1;
  if (a.master && a.param) std::memcpy(a.param, a.master, a.n * 4);
}

#define GPT_INSTANTIATE(R) template void step_cpu<R>(const StepArgs&);
GPT_OPTIMIZER_RULES(GPT_INSTANTIATE)
#undef GPT_INSTANTIATE

}  // namespace gpt::optim
