// The trainer: one run of the plan, from set-up (stack, model, data, checkpoint or initialisation, run
// log) through the loop of optimizer steps, evaluations and checkpoints.
#pragma once
#include <string>

#include "config/config.hpp"
#include "parallel/comm.hpp"
#include "run/plan.hpp"
#include "run/terminal.hpp"

namespace gpt {

// Identifies a sweep point in the run log.
struct PointInfo {
  int64_t index = -1;
  std::string values;     // "key=value" lines
};

// Outcome of a run, as recorded in its log.
struct RunResult {
  std::string status;     // ok | failed | oom | checkpointed
  std::string message;
  int exit_code = 0;
  RunTotals totals;       // steps, time, mean tokens/s and MFU, best val loss (rank 0's view)
};

// Trains one run of `plan` (made from cfg by make_plan). Errors that end the run are recorded in the log
// and returned (not thrown) when they are the run's own (bad config value, OOM, NaN); host-level
// failures still throw.
RunResult train(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume);

}  // namespace gpt
