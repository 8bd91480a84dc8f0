// Linked instead of step_cuda.cu when the binary is built without CUDA (make CUDA=0): nothing can reach
// it there (no CUDA backend exists to run on).
#include "base/common.hpp"
#include "optim/step.hpp"

namespace gpt::optim {

template <class Rule>
void step_cuda(const StepArgs&, void*) {
  throw Error(kExitFailure, "internal error: a CUDA optimizer step in a binary built without CUDA");
}

#define GPT_INSTANTIATE(R) template void step_cuda<R>(const StepArgs&, void*);
GPT_OPTIMIZER_RULES(GPT_INSTANTIATE)
#undef GPT_INSTANTIATE

void compensated_residuals_cuda(uint16_t*, const float*, size_t, void*) {
  throw Error(kExitFailure, "internal error: a CUDA kernel in a binary built without CUDA");
}

}  // namespace gpt::optim
