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
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/kernel_boundary.cuh"
#include "base/common.hpp"
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

std::vector<AttentionShape> parse_shapes(const std::string& text) {
  std::vector<AttentionShape> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    AttentionShape s;
    char c1 = 0, c2 = 0, c3 = 0;
    std::stringstream is(item);
    if (!(is >> s.B >> c1 >> s.T >> c2 >> s.NH >> c3 >> s.HS) || c1 != ':' || c2 != ':' || c3 != ':' || s.B <= 0 ||
        s.T <= 0 || s.NH <= 0 || s.HS <= 0 || !is.eof())
      throw gpt::input_error("--shapes: '" + item + "' is not B:T:NH:HS with positive integers");
    out.push_back(s);
  }
  if (out.empty()) throw gpt::input_error("--shapes: no shape given");
  return out;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, shapes_text = "64:1024:12:64,16:1024:25:64";
  bool knobs = false, deterministic = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool has_value = i + 1 < argc;
      if (a == "--json" && has_value) {
        json_path = argv[++i];
      } else if (a == "--shapes" && has_value) {
        shapes_text = argv[++i];
      } else if (a == "--knobs") {
        knobs = true;
      } else if (a == "--deterministic") {
        deterministic = true;
      } else {
        std::fprintf(stderr,
                     "unknown or incomplete argument '%s'\nusage: %s [--json FILE] [--knobs] [--deterministic] "
                     "[--shapes B:T:NH:HS,...]\n",
                     a.c_str(), argv[0]);
        return 1;
      }
    }
    const std::vector<AttentionShape> shapes = parse_shapes(shapes_text);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      std::printf("SKIP: no CUDA device\n");
      return 0;
    }
    CudnnAttention attn(
        [](size_t n) {
          void* p = nullptr;
          CUDA_CHECK(cudaMalloc(&p, n));
          return p;
        },
        [](void* p) { cudaFree(p); }, deterministic, knobs ? AttentionTune::kKnobs : AttentionTune::kPlans);
    for (const AttentionShape& s : shapes) {
      Buffers b(s);
      attn.fwd(b.out, b.lse, b.qkv, s, nullptr);
      attn.bwd(b.dqkv, b.dout, b.qkv, b.out, b.lse, s, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    // per graph: the heuristic's first plan against the fastest
    std::string js = "{\"knobs\": " + std::string(knobs ? "true" : "false") +
                     ", \"deterministic\": " + (deterministic ? "true" : "false") + ", \"plans\": [";
    std::printf("%-32s %5s %9s %6s  %s\n", "graph", "rank", "ms", "chosen", "plan");
    const auto& t = attn.tuning();
    for (size_t i = 0; i < t.size(); ++i) {
      std::printf("%-32s %5d %9.4f %6s  %s\n", t[i].graph.c_str(), t[i].rank, t[i].ms, t[i].chosen ? "*" : "",
                  t[i].plan.c_str());
      char buf[128];
      std::snprintf(buf, sizeof buf, "\"rank\": %d, \"ms\": %.5f, \"chosen\": %s", t[i].rank, t[i].ms,
                    t[i].chosen ? "true" : "false");
      js += std::string(i ? ", " : "") + "{\"graph\": \"" + t[i].graph + "\", \"plan\": \"" +
            json_escape(t[i].plan) + "\", " + buf + "}";
    }
    js += "]}\n";
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
    if (!json_path.empty()) gpt::write_file_whole(json_path, js);
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
