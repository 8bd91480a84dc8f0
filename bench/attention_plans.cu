// Which of cuDNN's execution plans is fastest for the causal flash attention of a GPT-2 training step,
// and how far the heuristic's first choice is from it.
//
//   build/bench/attention_plans [--json FILE] [--knobs] [--deterministic] [--shapes B:T:NH:HS,...]
//                                                           (FILE is written whole or not at all)
//
// For each shape (default: GPT-2 124M at B=64 and 1558M at B=16, T=1024, head size 64) the forward
// (with softmax stats) and backward graphs are built as the trainer builds them, with every plan of the
// heuristic's modes A and fallback (training.deterministic: false tunes these on first use) and, with
// --knobs, every engine's knob combinations as well. Each plan is run once, then timed 5 times back to
// back; the table and the JSON give the median. Rank 0 is the heuristic's first choice, what the
// trainer runs with training.deterministic: true. --deterministic builds the backward graphs without
// atomics, as the deterministic mode does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda/kernel_boundary.cuh"
#include "base/common.hpp"
#include "bench/attention_bench.hpp"
#include "kernels/attention.cuh"
#include "kernels/check.cuh"
#include "kernels/common.cuh"

namespace {

using gpt::kern::AttentionPlanTime;
using gpt::kern::AttentionShape;
using gpt::kern::AttentionTune;
using gpt::kern::CudnnAttention;

struct Fill {
  __nv_bfloat16* p;
  uint32_t seed;
  __device__ void operator()(size_t i) const {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16(float(h & 0xffff) / 32768.0f - 1.0f);  // uniform in [-1, 1)
  }
};

struct Buffers {
  __nv_bfloat16 *qkv = nullptr, *out = nullptr, *dout = nullptr, *dqkv = nullptr;
  float* lse = nullptr;
  explicit Buffers(const AttentionShape& s) {
    const size_t n = size_t(s.B) * s.T * s.NH * s.HS;
    CUDA_CHECK(cudaMalloc(&qkv, 3 * n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&dqkv, 3 * n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&out, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&dout, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&lse, size_t(s.B) * s.NH * s.T * sizeof(float)));
    gpt::kern::launch_elementwise(3 * n, Fill{qkv, 1u}, nullptr);
    gpt::kern::launch_elementwise(n, Fill{dout, 2u}, nullptr);
  }
  ~Buffers() {
    for (void* p : {static_cast<void*>(qkv), static_cast<void*>(out), static_cast<void*>(dout),
                    static_cast<void*>(dqkv), static_cast<void*>(lse)})
      cudaFree(p);
  }
};

}  // namespace

int main(int argc, char** argv) {
  gpt::bench::AttentionOptions o;
  o.shapes = "64:1024:12:64,16:1024:25:64";
  bool knobs = false;
  try {
    if (!gpt::bench::parse_args(argc, argv, o, {{"--knobs", &knobs}})) return 1;
    const std::vector<AttentionShape> shapes = gpt::bench::parse_shapes(o.shapes);
    if (gpt::bench::skip_without_device()) return 0;
    CudnnAttention attn(
        [](size_t n) {
          void* p = nullptr;
          CUDA_CHECK(cudaMalloc(&p, n));
          return p;
        },
        [](void* p) { cudaFree(p); }, o.deterministic, knobs ? AttentionTune::kKnobs : AttentionTune::kPlans);
    for (const AttentionShape& s : shapes) {
      Buffers b(s);
      attn.fwd(b.out, b.lse, b.qkv, s, nullptr);
      attn.bwd(b.dqkv, b.dout, b.qkv, b.out, b.lse, s, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    // per graph: the heuristic's first plan against the fastest
    nlohmann::ordered_json plans = nlohmann::ordered_json::array();
    std::printf("%-32s %5s %9s %6s  %s\n", "graph", "rank", "ms", "chosen", "plan");
    const auto& t = attn.tuning();
    for (size_t i = 0; i < t.size(); ++i) {
      std::printf("%-32s %5d %9.4f %6s  %s\n", t[i].graph.c_str(), t[i].rank, t[i].ms, t[i].chosen ? "*" : "",
                  t[i].plan.c_str());
      plans.push_back(
          {{"graph", t[i].graph}, {"plan", t[i].plan}, {"rank", t[i].rank}, {"ms", t[i].ms}, {"chosen", t[i].chosen}});
    }
    std::printf("\n%-32s %12s %12s %8s\n", "graph", "heuristic ms", "fastest ms", "gain");
    for (size_t i = 0; i < t.size(); ++i) {
      if (i > 0 && t[i].graph == t[i - 1].graph) continue;
      double first = -1.0, best = -1.0;
      for (const AttentionPlanTime& p : t)
        if (p.graph == t[i].graph) {
          if (p.rank == 0) first = p.ms;
          if (p.chosen) best = p.ms;
        }
      if (first > 0)
        std::printf("%-32s %12.4f %12.4f %7.1f%%\n", t[i].graph.c_str(), first, best, 100.0 * (1.0 - best / first));
      else
        std::printf("%-32s %12s %12.4f  (the heuristic's first plan did not run)\n", t[i].graph.c_str(), "-", best);
    }
    gpt::bench::write_json(o.json_path, {{"knobs", knobs}, {"deterministic", o.deterministic}, {"plans", plans}});
  } catch (const gpt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.code();
  } catch (const gpt::kern::KernelError& k) {
    const gpt::Error e = gpt::to_error(k);
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.code();
  }
  return 0;
}
