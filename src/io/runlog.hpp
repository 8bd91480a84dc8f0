// The run log, <run dir>/log.h5 (layout in docs/FORMATS.md). Rank 0 writes it; it is readable with
// h5py while the run goes on (SWMR), and its status says how the run ended.
#pragma once
#include <cmath>
#include <memory>
#include <string>

#include "base/memory.hpp"
#include "dist/placement.hpp"

namespace gpt {

struct RunInfo {
  std::string name, config_yaml, device, hardware, git_rev, point_values;
  std::string precision;  // "bf16", "fp32", or "fp8: " and the recipe (model/fp8_recipe.hpp)
  int64_t n_params = 0, tokens_per_step = 0, world_size = 1, zero_stage = 0, point_index = -1;
  double flops_per_token = 0, peak_flops = 0;
  std::vector<RankPlace> ranks;  // node and local rank of every rank: /ranks, rewritten on resume
};

struct TrainRow {
  int64_t step;
  double loss, lr, grad_norm, step_ms, tokens_per_s, mfu;
  double elapsed_s;  // wall clock since the run's first step (continued across resumes)
  int64_t tokens;    // tokens trained on up to and including this step, all ranks
  int64_t fp8_saturated = 0;  // precision fp8: scaled tensors whose values were clipped since the last row
};

// One evaluation: NaN (or an empty sample) for what was not measured.
struct EvalRow {
  int64_t step = 0;
  double val_loss = NAN, hellaswag_acc = NAN, hellaswag_acc_norm = NAN;
  std::string sample;  // generated text (token ids without a vocabulary)
  bool empty() const { return std::isnan(val_loss) && std::isnan(hellaswag_acc) && sample.empty(); }
};

class RunLog {
 public:
  // Creates the log, or with resume_step >= 0 reopens it and drops rows after that step.
  RunLog(const std::string& path, const RunInfo& info, const MemoryBreakdown& predicted, int64_t resume_step);
  ~RunLog();
  void train_row(const TrainRow& r);
  void eval_row(const EvalRow& r);
  // elapsed_s of the last row kept when the log was reopened to resume (0 for a new log)
  double elapsed_before() const;
  // Ends SWMR writing and records the outcome and the measured memory.
  void finish(const std::string& status, const std::string& message, const MemoryBreakdown& measured,
              size_t measured_peak);

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace gpt
