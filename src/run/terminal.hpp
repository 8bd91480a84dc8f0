// What rank 0 prints while a run goes: one line per logged step, notes, a progress bar with ETA on an
// interactive terminal, and the run's summary at the end.
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "io/runlog.hpp"

namespace gpt {

// The totals the end-of-run summary and a sweep's one line per point report.
struct RunTotals {
  int64_t steps = 0;              // optimizer steps this process ran
  double seconds = 0;             // wall-clock time of those steps
  double eval_seconds = 0;        // wall-clock time of the evaluations between them
  double tokens_per_s = 0;        // mean over the steps after the first (warm-up), or the first alone
  double mfu = NAN;               // the same mean as a fraction of peak (NaN on CPU)
  double best_val_loss = NAN;     // NaN when there was no evaluation
};

// The terminal is a metric sink: a line per logged step, the evaluations' results and samples.
class Terminal final : public MetricSink {
 public:
  // on: this process prints (rank 0); progress: log.progress.
  Terminal(bool on, bool progress, int steps);
  // Every optimizer step, logged or not: its time, tokens and MFU, for the totals.
  void count_step(double ms, int64_t tokens, double mfu);
  // Every evaluation: its wall-clock time, for the totals.
  void count_eval(double seconds) { totals_.eval_seconds += seconds; }
  // Every step: the progress bar redrawn, at most 10 times a second (a terminal over ssh shows every
  // redraw of a fast run's thousands of steps otherwise) and always at the last step; eta_s is what the
  // next logged line says too.
  void progress(int steps_done, double eta_s);
  // MetricSink. A logged step: loss, lr, norm, time, throughput, MFU, elapsed time, peak memory, ETA.
  std::string name() const override { return "the terminal"; }
  void train_row(const TrainRow& r) override;
  void eval_row(const EvalRow& r) override;  // its results (and the best validation loss so far)
  void note(const std::string& s);
  // A note, once, on what the step lines' `mem` is next to the plan's prediction (predicted: the run's
  // buffers): the device's peak (a GPU), or the whole process's peak RSS (the CPU), which also holds the
  // binary and its libraries (baseline: the RSS before the buffers).
  void memory_meaning(bool cpu, double predicted, double baseline);
  // The closing lines: steps, time, mean tokens/s and MFU, best val loss, the log and the last checkpoint.
  // complete_at >= 0: the run was already complete at that step (a resume with nothing to train), which
  // is what the first line says instead.
  void summary(const std::string& status, const std::string& log_path, const std::string& last_checkpoint,
               int64_t complete_at = -1);
  const RunTotals& totals() const { return totals_; }

 private:
  void bar(int done, double eta_s);
  void clear_bar();
  bool on_, tty_;
  int steps_;
  bool bar_shown_ = false;
  double eta_s_ = NAN;
  std::chrono::steady_clock::time_point bar_drawn_{};  // the last redraw
  RunTotals totals_;
  double timed_s_ = 0, timed_tokens_ = 0, timed_mfu_ = 0;  // the steps after the first
  int64_t timed_ = 0;
};

// Whether stdout is a terminal a person watches: this process's controlling terminal, with the process
// in its foreground. mpirun forwards every rank's output through a pseudo-terminal of its own even when
// its output goes to a file or a pipe: isatty() says yes there, and a progress bar would fill the log
// with \r lines, but that terminal controls no one.
bool interactive_stdout();

std::string format_duration(double seconds);  // "3m07s", "1h02m", "?"

}  // namespace gpt
