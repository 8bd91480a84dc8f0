// What rank 0 prints while a run goes: one line per logged step, notes, and a progress bar with ETA on
// an interactive terminal.
#pragma once
#include <string>

#include "io/runlog.hpp"

namespace gpt {

class Terminal {
 public:
  Terminal(bool on, bool progress, int steps);
  void step_line(const TrainRow& r, int steps_done, double eta_s);
  void note(const std::string& s);

 private:
  void bar(int done, double eta_s);
  void clear_bar();
  bool on_, tty_;
  int steps_;
  bool bar_shown_ = false;
};

std::string format_duration(double seconds);  // "3m07s", "1h02m", "?"

}  // namespace gpt
