// Causal self-attention through cuDNN's fused flash attention (SDPA forward with softmax stats, SDPA
// backward), built with the cudnn-frontend graph API. This is the only file that includes the frontend
// (it compiles slowly). One graph per (B, T, NH, HS) and direction, built on first use and kept here.
// cuDNN's heuristic ranks the execution plans (engine configurations) that can run a graph; its first
// is not always the fastest, so a tuning level can time them on first use and keep the fastest.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gpt::kern {

struct AttentionShape {
  int B = 0, T = 0, NH = 0, HS = 0;
};

// Which execution plan runs a graph.
enum class AttentionTune {
  kHeuristic,  // the heuristic's first plan (reproducible: the same plan on every run)
  kPlans,      // every plan of heuristic modes A and fallback, timed on first use; the fastest is kept
  kKnobs,      // also every engine's knob combinations
};
// The trainer uses kHeuristic: on an H200 (cuDNN 9.19, head size 64, T=1024) the heuristic's first plan
// was the fastest of all, knobs included (bench/attention_plans, bench/RESULTS.md).

// One timed plan of one graph, from the tuning.
struct AttentionPlanTime {
  std::string graph;  // "fwd B=64 T=1024 NH=12 HS=64" or "bwd ..."
  std::string plan;   // cuDNN's name of the engine configuration
  int rank = 0;       // position in the candidate list: 0 is the heuristic's first choice
  double ms = 0.0;    // median of the timed runs
  bool chosen = false;
};

class CudnnAttention {
 public:
  // alloc/free: device memory for cuDNN's workspace, through the owner's allocator (so it is counted).
  // deterministic: ask for the backward algorithm without atomics (dQ reduced in a fixed order).
  CudnnAttention(std::function<void*(size_t)> alloc, std::function<void(void*)> free, bool deterministic,
                 AttentionTune tune = AttentionTune::kHeuristic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // qkv (B,T,3,NH,HS) bf16; out (B,T,NH,HS) bf16; lse (B,NH,T) fp32: natural-log logsumexp of the
  // scaled scores, which is what cuDNN calls the softmax stats.
  void fwd(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const AttentionShape& sh, cudaStream_t s);
  // dqkv (B,T,3,NH,HS) overwritten
  void bwd(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
           const float* lse, const AttentionShape& sh, cudaStream_t s);

  // every plan timed so far, in the order timed (empty with kHeuristic)
  const std::vector<AttentionPlanTime>& tuning() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt::kern
