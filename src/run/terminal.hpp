// What rank 0 prints while a run goes: one line per logged step, notes, a progress bar with ETA on an
// interactive terminal, and the run's summary at the end.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "io/runlog.hpp"

namespace gpt {

// The totals the end-of-run summary and a sweep's one line per point report.
struct RunTotals {
  int64_t steps = 0;              // optimizer steps this process ran
  double seconds = 0;             // wall-clock time of those steps
  double tokens_per_s = 0;        // mean over the steps after the first (warm-up), or the first alone
  double mfu = NAN;               // the same mean as a fraction of peak (NaN on CPU)
  double best_val_loss = NAN;     // NaN when there was no evaluation
};

class Terminal {
 public:
  // on: this process prints (rank 0); progress: log.progress.
  Terminal(bool on, bool progress, int steps);
  // Every optimizer step, logged or not: its time, tokens and MFU, for the totals.
  void count_step(double ms, int64_t tokens, double mfu);
  void count_eval(double val_loss);
  // A logged step: loss, lr, norm, time, throughput, elapsed time, memory (`mem_bytes`: peak in use).
  void step_line(const TrainRow& r, int steps_done, double eta_s, size_t mem_bytes);
  void note(const std::string& s);
  // The closing lines: steps, time, mean tokens/s and MFU, best val loss, the log and the last checkpoint.
  void summary(const std::string& status, const std::string& log_path, const std::string& last_checkpoint);
  const RunTotals& totals() const { return totals_; }

 private:
  void bar(int done, double eta_s);
  void clear_bar();
  bool on_, tty_;
  int steps_;
  bool bar_shown_ = false;
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
