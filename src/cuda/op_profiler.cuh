// Per-op GPU time inside real training steps (log.op_profile): a CUDA event before and after every op on
// the compute stream. Events are read when the step ends (the backend's synchronize), so timing adds no
// host synchronisation. A step's window runs from its first op's start to its last op's end; the part of
// the window no op covers is idle time (launch gaps, host work, waits on the communication stream).
// The trainer resets the tally after its warm-up step (plan and graph building).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cuda/cuda_check.cuh"

namespace gpt {

class OpProfiler {
 public:
  explicit OpProfiler(bool enabled) : enabled_(enabled) {}
  ~OpProfiler() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  bool enabled() const { return enabled_; }

  // Times what is queued on `stream` between construction and destruction under `name`.
  class Scope {
   public:
    Scope(OpProfiler& p, cudaStream_t stream, const char* name) : p_(p), stream_(stream) {
      if (!p_.enabled_) return;
      name_ = name;
      start_ = p_.record(stream_);
    }
    Scope(OpProfiler& p, cudaStream_t stream, const std::string& name) : Scope(p, stream, name.c_str()) {}
    ~Scope() {
      if (p_.enabled_) p_.pending_.push_back({std::move(name_), start_, p_.record(stream_)});
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler& p_;
    cudaStream_t stream_;
    std::string name_;
    cudaEvent_t start_ = nullptr;
  };

  // Called after the stream was synchronised at the end of a step: reads and recycles the events.
  void harvest() {
    if (!enabled_ || pending_.empty()) return;
    ++windows_;
    float window = 0;
    CUDA_CHECK(cudaEventElapsedTime(&window, pending_.front().start, pending_.back().end));
    total_window_ms_ += window;
    for (const Pending& q : pending_) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, q.start, q.end));
      Stat& s = stats_[q.name];
      s.ms += ms;
      s.calls += 1;
    }
    for (const Pending& q : pending_) free_.insert(free_.end(), {q.start, q.end});
    pending_.clear();
  }

  void reset() {
    stats_.clear();
    windows_ = 0;
    total_window_ms_ = 0;
  }

  // "op | calls/step | ms/step | share of the step", largest first, then the idle time.
  std::string table() const {
    const int steps = windows_;
    if (!enabled_ || steps <= 0) return "";
    std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
    const double window = total_window_ms_ / steps;
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "op profile over %d steps: %.2f ms of GPU time per step (first op to last)\n",
                  steps, window);
    out += line;
    std::snprintf(line, sizeof line, "  %-44s %8s %10s %7s\n", "op", "calls", "ms/step", "share");
    out += line;
    double busy = 0;
    for (auto& [name, s] : rows) {
      const double ms = s.ms / steps;
      busy += ms;
      std::snprintf(line, sizeof line, "  %-44s %8.1f %10.3f %6.1f%%\n", name.c_str(), double(s.calls) / steps, ms,
                    100.0 * ms / window);
      out += line;
    }
    std::snprintf(line, sizeof line, "  %-44s %8s %10.3f %6.1f%%", "(idle between ops)", "", window - busy,
                  100.0 * (window - busy) / window);
    out += line;
    return out;
  }

 private:
  struct Pending {
    std::string name;
    cudaEvent_t start, end;
  };
  struct Stat {
    double ms = 0;
    long calls = 0;
  };
  cudaEvent_t record(cudaStream_t s) {
    cudaEvent_t e;
    if (free_.empty()) {
      CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    } else {
      e = free_.back();
      free_.pop_back();
    }
    CUDA_CHECK(cudaEventRecord(e, s));
    return e;
  }

  bool enabled_;
  std::vector<cudaEvent_t> pool_, free_;
  std::vector<Pending> pending_;
  std::map<std::string, Stat> stats_;
  int windows_ = 0;
  double total_window_ms_ = 0;
};

}  // namespace gpt
