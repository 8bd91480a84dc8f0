// A testing hook: GPT2_TRAIN_FAULT="SPEC[,SPEC...]", each SPEC being PHASE@RANK[:STEP], makes rank RANK
// fail in PHASE (setup, step, eval, checkpoint, log) at step STEP (any step when left out), with the
// error a real failure there would raise. The tests use it to show that a failure on one rank, in any
// phase, ends every rank at once with the documented exit status (tests/integration/test_reliability.py).
// Read once per run. Phase `eval_data` fails like `eval` but agreed by every rank, as a bad evaluation
// file found while evaluating is. Other phases steer what happens rather than fail:
//   checkpoint_hold   rank RANK's background checkpoint write of step STEP stops for good, before its
//                     first byte, while training goes on (a test then kills the run during that write)
//   checkpoint_done   that write is on disk before training goes on (published at the usual boundary):
//                     a failure before that boundary finds it finished
//   checkpoint_late   that write starts its first byte only once the run waits for it (at the next
//                     checkpoint, the end, a stop or a failure): a failure finds it still running
//   sigterm           rank RANK raises SIGTERM at the end of step STEP, as if it had been sent one
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

class FaultInjector {
 public:
  explicit FaultInjector(int rank);
  // Throws Error(kExitFailure, "injected fault ...") when the environment asks for this phase here.
  void at(const char* phase, int64_t step) const;
  // Blocks the calling thread for the rest of the process's life when the environment asks for this
  // phase here.
  void hold(const char* phase, int64_t step) const;
  // Whether the environment asks for this phase here (the phases that steer rather than fail).
  bool armed(const char* phase, int64_t step) const;
  // Whether it asks for this phase on any rank at any step: the same answer on every rank.
  bool any(const char* phase) const;
  // Raises SIGTERM in this process when the environment asks for this phase here.
  void signal(const char* phase, int64_t step) const;

 private:
  struct Spec {
    std::string phase;
    int rank = -1;
    int64_t step = -1;  // -1: any step
  };
  const Spec* find(const char* phase, int64_t step) const;
  int rank_;
  std::vector<Spec> specs_;
};

}  // namespace gpt
