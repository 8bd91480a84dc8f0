#include "run/faults.hpp"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "base/common.hpp"

namespace gpt {

FaultInjector::FaultInjector(int rank) : rank_(rank) {
  const char* env = std::getenv("GPT2_TRAIN_FAULT");
  if (!env || !*env) return;
  std::stringstream all(env);
  for (std::string s; std::getline(all, s, ',');) {
    const size_t at = s.find('@'), colon = s.find(':');
    const std::string bad = "GPT2_TRAIN_FAULT='" + std::string(env) + "': '" + s + "' is not PHASE@RANK[:STEP]";
    if (at == std::string::npos || at == 0) throw input_error(bad);
    Spec sp;
    sp.phase = s.substr(0, at);
    try {
      size_t used = 0;
      const std::string r = s.substr(at + 1, colon == std::string::npos ? std::string::npos : colon - at - 1);
      sp.rank = std::stoi(r, &used);
      if (used != r.size()) throw input_error(bad);
      if (colon != std::string::npos) {
        const std::string st = s.substr(colon + 1);
        sp.step = std::stoll(st, &used);
        if (used != st.size()) throw input_error(bad);
      }
    } catch (const std::logic_error&) {  // stoi/stoll: not a number, or out of range
      throw input_error(bad);
    }
    specs_.push_back(sp);
  }
}

const FaultInjector::Spec* FaultInjector::find(const char* phase, int64_t step) const {
  for (const Spec& s : specs_)
    if (s.rank == rank_ && s.phase == phase && (s.step < 0 || s.step == step)) return &s;
  return nullptr;
}

void FaultInjector::at(const char* phase, int64_t step) const {
  if (!find(phase, step)) return;
  throw Error(kExitFailure, "injected fault (GPT2_TRAIN_FAULT) in " + std::string(phase) + " on rank " +
                                std::to_string(rank_) + " at step " + std::to_string(step));
}

void FaultInjector::hold(const char* phase, int64_t step) const {
  if (!find(phase, step)) return;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

bool FaultInjector::armed(const char* phase, int64_t step) const { return find(phase, step) != nullptr; }

bool FaultInjector::any(const char* phase) const {
  for (const Spec& s : specs_)
    if (s.phase == phase) return true;
  return false;
}

void FaultInjector::signal(const char* phase, int64_t step) const {
  if (find(phase, step)) std::raise(SIGTERM);
}

}  // namespace gpt
