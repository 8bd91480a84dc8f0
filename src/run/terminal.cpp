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

void Terminal::count_eval(double v) {
  if (std::isnan(totals_.best_val_loss) || v < totals_.best_val_loss) totals_.best_val_loss = v;
}

void Terminal::step_line(const TrainRow& r, int steps_done, double eta_s, size_t mem_bytes) {
  if (!on_) return;
  clear_bar();
  char mfu[24] = "";
  if (!std::isnan(r.mfu)) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * r.mfu);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %6lld/%d | loss %.4f | lr %.3g | norm %.3f | %8.1f ms | %9.0f tok/s%s | %s | mem %s | ETA %s\n",
                (long long)r.step, steps_, r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s, mfu,
                format_duration(r.elapsed_s).c_str(), format_bytes(double(mem_bytes)).c_str(),
                format_duration(eta_s).c_str());
  std::cout << buf << std::flush;
  bar(steps_done, eta_s);
}

void Terminal::note(const std::string& s) {
  if (!on_) return;
  clear_bar();
  std::cout << s << "\n" << std::flush;
}

void Terminal::summary(const std::string& status, const std::string& log_path, const std::string& last_ckpt) {
  if (!on_) return;
  clear_bar();
  const RunTotals& t = totals_;
  char buf[256];
  std::snprintf(buf, sizeof buf, "run %s: %lld step(s) in %s, %.0f tokens/s", status.c_str(), (long long)t.steps,
                format_duration(t.seconds).c_str(), t.tokens_per_s);
  std::string s = buf;
  if (!std::isnan(t.mfu)) s += ", MFU " + shortest(std::round(1000 * t.mfu) / 10) + "%";
  if (!std::isnan(t.best_val_loss)) {
    std::snprintf(buf, sizeof buf, ", best val loss %.4f", t.best_val_loss);
    s += buf;
  }
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
}

void Terminal::clear_bar() {
  if (bar_shown_) std::cout << "\r" << std::string(72, ' ') << "\r";
  bar_shown_ = false;
}

}  // namespace gpt
