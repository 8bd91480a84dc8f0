// The run log, <run dir>/log.h5 (layout in docs/FORMATS.md). Rank 0 writes it; it is readable with
// h5py while the run goes on (SWMR), and its status says how the run ended.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "base/memory.hpp"
#include "io/metrics.hpp"
#include "parallel/placement.hpp"

namespace gpt {

// The disk space the run log keeps in reserve beside it (log.h5.reserve), given up when a write fails so
// that the log still closes readable with its outcome on a full disk. A run does not start without it.
inline constexpr uint64_t kLogReserveBytes = uint64_t(256) << 10;

struct RunInfo {
  std::string name, config_yaml, device, hardware, git_rev, point_values;
  std::string data_files;  // what data.train matched: "SIZE XXH3 PATH" lines (run/resume.hpp)
  std::string precision;  // "bf16", "fp32", or "fp8: " and the recipe (model/fp8_scaling.hpp)
  int64_t n_params = 0, tokens_per_step = 0, world_size = 1, zero_stage = 0, point_index = -1;
  double flops_per_token = 0, peak_flops = 0;
  double startup_s = -1;  // seconds from this process's start to its first training step; < 0: unknown
  std::vector<RankPlace> ranks;  // node and local rank of every rank: /ranks, rewritten on resume
  // parallel.shared_gpu: host: collectives staged through host memory (ranks sharing GPUs), so the
  // throughput is not representative; the attribute `shared_gpu` (1, else 0)
  bool shared_gpu = false;
};

// What an earlier run's log says, read without changing a byte of it.
struct LoggedRun {
  bool exists = false;
  std::string status;     // running (also: killed), ok, failed, oom, checkpointed
  int64_t last_step = 0;  // the last /train row's step (0 without rows)
};
// Reads path's status and last step; absent: exists false. A file there that HDF5 cannot read, or that
// is not a run log, is input_error naming it.
LoggedRun read_logged_run(const std::string& path);

class RunLog final : public MetricSink {
 public:
  // Creates the log, or with resume_step >= 0 reopens it and drops rows after that step. First of all it
  // takes its disk reserve: without kLogReserveBytes free it is input_error naming the filesystem, and
  // the log is left as it was. A log that cannot be reopened is input_error naming it.
  RunLog(const std::string& path, const RunInfo& info, const MemoryBreakdown& predicted, int64_t resume_step);
  ~RunLog() override;
  std::string name() const override { return "log.h5"; }
  void train_row(const TrainRow& r) override;  // a /train row: every metric of kTrainMetrics
  void eval_row(const EvalRow& r) override;    // an /eval row, and the sample's text into /samples
  // elapsed_s of the last row kept when the log was reopened to resume (0 for a new log)
  double elapsed_before() const;
  // the step of the last /eval row kept when the log was reopened to resume (-1: none, or a new log)
  int64_t last_eval_step() const;
  // Ends SWMR writing and records the outcome and the measured memory.
  // measured_baseline: what the process held before the backend allocated (CPU: its RSS then; GPU: 0).
  void finish(const std::string& status, const std::string& message, const MemoryBreakdown& measured,
              size_t measured_peak, size_t measured_baseline = 0);

 private:
  void open(const RunInfo& info, const MemoryBreakdown& predicted, int64_t resume_step);
  void reopen(const RunInfo& info, int64_t resume_step);
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace gpt
