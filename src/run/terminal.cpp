#include "run/terminal.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "base/format.hpp"
#include "run/plan.hpp"

namespace gpt {

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  char buf[32];
  const long t = long(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

bool interactive_stdout() {
  // a terminal, and this process's own controlling terminal with this process in its foreground
  return isatty(1) == 1 && tcgetpgrp(1) == getpgrp();
}

Terminal::Terminal(bool on, bool progress, int steps)
    : on_(on), tty_(on && progress && interactive_stdout()), steps_(steps) {}

void Terminal::count_step(double ms, int64_t tokens, double mfu) {
  ++totals_.steps;
  totals_.seconds += ms / 1000.0;
  if (totals_.steps == 1) {  // the warm-up step counts only until there is another
    totals_.tokens_per_s = tokens / (ms / 1000.0);
    totals_.mfu = mfu;
    return;
  }
  ++timed_;
  timed_s_ += ms / 1000.0;
  timed_tokens_ += double(tokens);
  timed_mfu_ += mfu * ms / 1000.0;
  totals_.tokens_per_s = timed_tokens_ / timed_s_;
  totals_.mfu = timed_mfu_ / timed_s_;
}

void Terminal::train_row(const TrainRow& r) {
  if (!on_) return;
  clear_bar();
  using M = TrainMetric;
  char mfu[24] = "";
  if (r.has(M::mfu)) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * r[M::mfu]);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %6lld/%d | loss %.4f | lr %.3g | norm %.3f | %8.1f ms | %9.0f tok/s%s | %s | mem %s | ETA %s\n",
                (long long)r[M::step], steps_, r[M::loss], r[M::lr], r[M::grad_norm], r[M::step_ms],
                r[M::tokens_per_s], mfu, format_duration(r[M::elapsed_s]).c_str(),
                format_bytes(r.has(M::peak_memory) ? r[M::peak_memory] : 0.0).c_str(), format_duration(eta_s_).c_str());
  std::cout << buf << std::flush;
  bar(int(r[M::step]), eta_s_);
}

void Terminal::eval_row(const EvalRow& r) {
  using M = EvalMetric;
  if (r.has(M::val_loss) && (std::isnan(totals_.best_val_loss) || r[M::val_loss] < totals_.best_val_loss))
    totals_.best_val_loss = r[M::val_loss];
  std::string s = "step " + std::to_string(int64_t(r[M::step]));
  char buf[96];
  if (r.has(M::val_loss)) s += " | val loss " + std::to_string(r[M::val_loss]);
  if (r.has(M::hellaswag_acc)) {
    std::snprintf(buf, sizeof buf, " | hellaswag acc_norm %.4f, acc %.4f", r[M::hellaswag_acc_norm], r[M::hellaswag_acc]);
    s += buf;
  }
  if (!r.sample.empty()) s += "\nsample: " + r.sample;
  note(s);
}

void Terminal::progress(int done, double eta_s) {
  eta_s_ = eta_s;
  constexpr std::chrono::milliseconds kRedraw{100};
  if (!tty_ || (done < steps_ && std::chrono::steady_clock::now() - bar_drawn_ < kRedraw)) return;
  bar(done, eta_s);
}

void Terminal::note(const std::string& s) {
  if (!on_) return;
  clear_bar();
  std::cout << s << "\n" << std::flush;
}

void Terminal::memory_meaning(bool cpu, double predicted, double baseline) {
  if (cpu)
    note("memory: the plan predicts " + format_bytes(predicted) + " per rank for the run's buffers; a step "
         "line's mem is the process's peak RSS, which held " + format_bytes(baseline) +
         " (the binary and its libraries) before them");
  else
    note("memory: the plan predicts " + format_bytes(predicted) + " per rank; a step line's mem is the device's "
         "peak allocation");
}

void Terminal::summary(const std::string& status, const std::string& log_path, const std::string& last_ckpt,
                       int64_t complete_at) {
  if (!on_) return;
  clear_bar();
  const RunTotals& t = totals_;
  if (complete_at >= 0) {
    std::string s = "run " + status + ": already complete at step " + std::to_string(complete_at) +
                    ", nothing to train\n  log: " + log_path;
    if (!last_ckpt.empty()) s += "\n  last checkpoint: " + last_ckpt;
    std::cout << s << "\n" << std::flush;
    return;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "run %s: %lld step(s) in %s, %.0f tokens/s", status.c_str(), (long long)t.steps,
                format_duration(t.seconds).c_str(), t.tokens_per_s);
  std::string s = buf;
  if (!std::isnan(t.mfu)) s += ", MFU " + shortest(std::round(1000 * t.mfu) / 10) + "%";
  if (!std::isnan(t.best_val_loss)) {
    std::snprintf(buf, sizeof buf, ", best val loss %.4f", t.best_val_loss);
    s += buf;
  }
  if (t.eval_seconds > 0) s += "\n  evaluation: " + format_duration(t.eval_seconds) + " besides the steps' time";
  s += "\n  log: " + log_path;
  if (!last_ckpt.empty()) s += "\n  last checkpoint: " + last_ckpt;
  std::cout << s << "\n" << std::flush;
}

void Terminal::bar(int done, double eta_s) {
  if (!tty_) return;
  const int w = 40, fill = steps_ ? int(double(done) / steps_ * w) : w;
  std::cout << "\r[" << std::string(fill, '#') << std::string(w - fill, '.') << "] " << done << "/" << steps_
            << "  ETA " << format_duration(eta_s) << std::flush;
  bar_shown_ = true;
  bar_drawn_ = std::chrono::steady_clock::now();
}

void Terminal::clear_bar() {
  if (bar_shown_) std::cout << "\r" << std::string(72, ' ') << "\r";
  bar_shown_ = false;
}

}  // namespace gpt
