#include "run/faults.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/common.hpp"

namespace gpt {

FaultInjector::FaultInjector(int rank) {
  const char* env = std::getenv("GPT2_TRAIN_FAULT");
  if (!env || !*env) return;
  const std::string s = env;
  const size_t at = s.find('@'), colon = s.find(':');
  if (at == std::string::npos) throw input_error("GPT2_TRAIN_FAULT='" + s + "': expected PHASE@RANK[:STEP]");
  phase_ = s.substr(0, at);
  try {
    const int r = std::stoi(s.substr(at + 1, colon == std::string::npos ? std::string::npos : colon - at - 1));
    step_ = colon == std::string::npos ? -1 : std::stoll(s.substr(colon + 1));
    armed_ = r == rank;
    rank_ = r;
  } catch (const std::exception&) {
    throw input_error("GPT2_TRAIN_FAULT='" + s + "': expected PHASE@RANK[:STEP]");
  }
}

void FaultInjector::at(const char* phase, int64_t step) const {
  if (!armed_ || phase_ != phase || (step_ >= 0 && step != step_)) return;
  throw Error(kExitFailure, "injected fault (GPT2_TRAIN_FAULT) in " + phase_ + " on rank " + std::to_string(rank_) +
                                " at step " + std::to_string(step));
}

void FaultInjector::hold(const char* phase, int64_t step) const {
  if (!armed_ || phase_ != phase || (step_ >= 0 && step != step_)) return;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace gpt
