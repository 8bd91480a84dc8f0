#include "run/terminal.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

namespace gpt {

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  char buf[32];
  const long t = long(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

Terminal::Terminal(bool on, bool progress, int steps) : on_(on), tty_(on && progress && isatty(1)), steps_(steps) {}

void Terminal::step_line(const TrainRow& r, int steps_done, double eta_s) {
  if (!on_) return;
  clear_bar();
  char mfu[24] = "";
  if (!std::isnan(r.mfu)) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * r.mfu);
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %6lld/%d | loss %.4f | lr %.2e | norm %.3f | %8.1f ms | %9.0f tok/s%s | ETA %s\n",
                (long long)r.step, steps_, r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s, mfu,
                format_duration(eta_s).c_str());
  std::cout << buf << std::flush;
  bar(steps_done, eta_s);
}

void Terminal::note(const std::string& s) {
  if (!on_) return;
  clear_bar();
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
