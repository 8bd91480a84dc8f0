// Per-op time inside training steps (log.op_profile), tallied by op name. A backend reports each op's
// start and end on one clock (milliseconds) and closes a window when a step ends; the window runs from
// its first op's start to its last op's end, and the part of it no op covers is idle time. The CPU
// backend times ops with the wall clock (its ops are synchronous); the CUDA backend with events
// (src/backend/cuda/op_profiler.cuh). The trainer resets the tally after its warm-up step.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

class OpTally {
 public:
  explicit OpTally(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  // while paused (outside training steps), ops are not timed
  void pause(bool paused) { paused_ = paused; }
  bool active() const { return enabled_ && !paused_; }

  void add(const std::string& name, double start_ms, double end_ms) {
    Stat& s = stats_[name];
    s.ms += end_ms - start_ms;
    s.calls += 1;
    lo_ = std::min(lo_, start_ms);
    hi_ = std::max(hi_, end_ms);
  }
  // the step ended: its window counts once
  void end_window() {
    if (hi_ < lo_) return;  // no op in this window
    window_ms_ += hi_ - lo_;
    ++windows_;
    lo_ = kNone, hi_ = -kNone;
  }
  // Ops may call other ops (the CPU matmul applies GELU through activation_fwd): only the outermost counts.
  bool enter() { return depth_++ == 0; }
  void leave() { --depth_; }

  void reset() {
    stats_.clear();
    windows_ = 0;
    window_ms_ = 0;
    lo_ = kNone, hi_ = -kNone;
  }

  // "op | calls/step | ms/step | share of the step", largest first, then the idle time; "" when off
  std::string table() const {
    if (!enabled_ || windows_ == 0) return "";
    std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
    const double window = window_ms_ / windows_;
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "op profile over %d steps: %.2f ms per step (first op to last)\n", windows_,
                  window);
    out += line;
    std::snprintf(line, sizeof line, "  %-44s %8s %10s %7s\n", "op", "calls", "ms/step", "share");
    out += line;
    double busy = 0;
    for (auto& [name, s] : rows) {
      const double ms = s.ms / windows_;
      busy += ms;
      std::snprintf(line, sizeof line, "  %-44s %8.1f %10.3f %6.1f%%\n", name.c_str(), double(s.calls) / windows_,
                    ms, 100.0 * ms / window);
      out += line;
    }
    std::snprintf(line, sizeof line, "  %-44s %8s %10.3f %6.1f%%", "(idle between ops)", "", window - busy,
                  100.0 * (window - busy) / window);
    out += line;
    return out;
  }

 private:
  struct Stat {
    double ms = 0;
    long calls = 0;
  };
  static constexpr double kNone = 1e300;
  bool enabled_, paused_ = false;
  std::map<std::string, Stat> stats_;
  int windows_ = 0, depth_ = 0;
  double window_ms_ = 0;
  double lo_ = kNone, hi_ = -kNone;
};

// "matmul_fwd 768x3072 +gelu": the name both backends give a matmul, by in x out features.
inline std::string matmul_op_name(const char* op, int in, int out, const char* extra) {
  return std::string(op) + " " + std::to_string(in) + "x" + std::to_string(out) + extra;
}

// Times the enclosing scope with the wall clock into `tally` (when it is enabled and this is the
// outermost op).
class WallScope {
 public:
  // a literal name is copied only when the profile is on
  WallScope(OpTally& tally, const char* name) : tally_(tally), on_(tally.active()) {
    if (!on_) return;
    name_ = name;
    outer_ = tally_.enter();
    t0_ = now_ms();
  }
  WallScope(OpTally& tally, std::string&& name) : WallScope(tally, "") {
    if (on_) name_ = std::move(name);
  }
  ~WallScope() {
    if (!on_) return;
    tally_.leave();
    if (outer_) tally_.add(name_, t0_, now_ms());
  }
  WallScope(const WallScope&) = delete;
  WallScope& operator=(const WallScope&) = delete;

 private:
  static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  OpTally& tally_;
  const bool on_;
  std::string name_;
  bool outer_ = false;
  double t0_ = 0;
};

}  // namespace gpt
