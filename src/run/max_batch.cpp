#include "run/max_batch.hpp"

#include "parallel/agree.hpp"

namespace gpt {

int find_max_micro_batch(const Plan& plan, double cap, HostComm& host, const std::function<bool(int)>& runs) {
  const bool gpu = plan.device == "cuda";
  if (!gpu && cap <= 0)
    throw AgreedError(kExitBadInput, "training.micro_batch: 'max' on the CPU needs training.memory_limit_gb (the search checks "
                      "the predicted memory against it)");
  auto fits = [&](int B) {
    if (cap > 0 && double(predict_memory(with_micro_batch(plan, B)).total()) > cap) return false;  // same everywhere
    if (!gpu) return true;
    const int ok = runs(B) ? 1 : 0;
    return host.max(-long(ok)) == -1;  // fits only if it fits on every rank
  };
  int lo = 0, hi = 1;
  while (hi <= 65536 && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  if (lo == 0)
    throw AgreedError(kExitOutOfMemory,
                "training.micro_batch: max: not even micro-batch 1 fits (" + describe(with_micro_batch(plan, 1)) + ")");
  return lo;
}

}  // namespace gpt
