// training.micro_batch: max. Doubling sizes, then bisection. A size fits when its predicted memory is
// within training.memory_limit_gb (if set) and, on a GPU, when `runs(B)` (a whole forward/backward at
// that size, within the limit) succeeds; every try is agreed across ranks.
#pragma once
#include <functional>

#include "parallel/comm.hpp"
#include "run/plan.hpp"

namespace gpt {
int find_max_micro_batch(const Plan& plan, double limit_bytes, HostComm& host, const std::function<bool(int)>& runs);
}  // namespace gpt
