// The optimizer's host loops for x86-64-v2 (step_loops.inc), and the choice between them and their
// x86-64-v3 build (step_cpu_fma.cpp) by what the CPU has.
#define GPT_STEP_ISA base
#include "optim/step_loops.inc"

namespace gpt::optim {

namespace fma {
template <class Rule>
void cpu_loop(const StepArgs& a);
template <class Rule>
void host_loop(const StepArgs& a, bool aligned);
}  // namespace fma

HostIsa host_isa() {
  static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");  // the CPU's, once
  return fma ? HostIsa::fma : HostIsa::base;
}

template <class Rule>
void step_cpu(const StepArgs& a, HostIsa isa) {
  if (isa == HostIsa::fma) fma::cpu_loop<Rule>(a);
  else base::cpu_loop<Rule>(a);
}

template <class Rule>
void step_host(const StepArgs& a, bool aligned, HostIsa isa) {
  if (isa == HostIsa::fma) fma::host_loop<Rule>(a, aligned);
  else base::host_loop<Rule>(a, aligned);
}

#define GPT_INSTANTIATE(R)                                  \
  template void step_cpu<R>(const StepArgs&, HostIsa);      \
  template void step_host<R>(const StepArgs&, bool, HostIsa);
GPT_OPTIMIZER_RULES(GPT_INSTANTIATE)
#undef GPT_INSTANTIATE

}  // namespace gpt::optim
