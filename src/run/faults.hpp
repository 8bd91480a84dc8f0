// A testing hook: GPT2_TRAIN_FAULT="PHASE@RANK[:STEP]" makes rank RANK fail in PHASE (setup, step, eval,
// checkpoint, log) at step STEP (any step when left out), with the error a real failure there would
// raise. The tests use it to show that a failure on one rank, in any phase, ends every rank at once
// with the documented exit status (tests/integration/test_reliability.py). Read once per run.
// Phase `checkpoint_hold` instead stops rank RANK's background checkpoint write of step STEP for good,
// before its first byte, while training goes on: a test then kills the run during that write.
#pragma once
#include <cstdint>
#include <string>

namespace gpt {

class FaultInjector {
 public:
  explicit FaultInjector(int rank);
  // Throws Error(kExitFailure, "injected fault ...") when the environment asks for this phase here.
  void at(const char* phase, int64_t step) const;
  // Blocks the calling thread for the rest of the process's life when the environment asks for this
  // phase here.
  void hold(const char* phase, int64_t step) const;

 private:
  std::string phase_;
  int rank_ = -1;
  int64_t step_ = -1;
  bool armed_ = false;
};

}  // namespace gpt
