// log.op_profile on the GPU: a CUDA event before and after every op on the compute stream, read when the
// step ends (the backend's synchronize), so timing adds no host synchronisation. The events' times,
// relative to the window's first event, go into an OpTally (src/op_tally.hpp), which keeps the table.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backend/cuda/kernel_boundary.cuh"
#include "backend/op_tally.hpp"
#include "kernels/check.cuh"

namespace gpt {

class OpProfiler {
 public:
  explicit OpProfiler(bool enabled) : tally_(enabled) {}
  ~OpProfiler() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  bool enabled() const { return tally_.enabled(); }
  void pause(bool paused) { tally_.pause(paused); }

  // Times what is queued on `stream` between construction and destruction under `name`.
  class Scope {
   public:
    // a literal name is copied only when the profile is on
    Scope(OpProfiler& p, cudaStream_t stream, const char* name) : p_(p), stream_(stream), on_(p.tally_.active()) {
      if (!on_) return;
      name_ = name;
      start_ = p_.record(stream_);
    }
    Scope(OpProfiler& p, cudaStream_t stream, std::string&& name) : Scope(p, stream, "") {
      if (on_) name_ = std::move(name);
    }
    ~Scope() {
      if (on_) p_.pending_.push_back({std::move(name_), start_, p_.record(stream_)});
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler& p_;
    cudaStream_t stream_;
    const bool on_;
    std::string name_;
    cudaEvent_t start_ = nullptr;
  };

  // Called after the stream was synchronised at the end of a step: reads and recycles the events.
  void harvest() {
    if (!enabled() || pending_.empty()) return;
    const cudaEvent_t origin = pending_.front().start;
    for (const Pending& q : pending_) {
      float s = 0, e = 0;
      kernel_boundary([&] {
        CUDA_CHECK(cudaEventElapsedTime(&s, origin, q.start));
        CUDA_CHECK(cudaEventElapsedTime(&e, origin, q.end));
      });
      tally_.add(q.name, s, e);
      free_.insert(free_.end(), {q.start, q.end});
    }
    tally_.end_window();
    pending_.clear();
  }
  void reset() { tally_.reset(); }
  std::string table() const { return tally_.table(); }

 private:
  struct Pending {
    std::string name;
    cudaEvent_t start, end;
  };
  cudaEvent_t record(cudaStream_t s) {
    cudaEvent_t e;
    if (free_.empty()) {
      kernel_boundary([&] { CUDA_CHECK(cudaEventCreate(&e)); });
      pool_.push_back(e);
    } else {
      e = free_.back();
      free_.pop_back();
    }
    kernel_boundary([&] { CUDA_CHECK(cudaEventRecord(e, s)); });
    return e;
  }

  OpTally tally_;
  std::vector<cudaEvent_t> pool_, free_;
  std::vector<Pending> pending_;
};

}  // namespace gpt
