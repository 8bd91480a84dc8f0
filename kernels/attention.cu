// cuDNN flash attention (see attention.cuh). The packed qkv buffer (B,T,3,NH,HS) is described to cuDNN
// as three (B,NH,T,HS) tensors with strides (T*3C, HS, 3C, 1) and offsets 0, C, 2C: no permute copies.
// out/dout (B,T,NH,HS) are (B,NH,T,HS) tensors with strides (T*C, HS, C, 1). Stats (B,NH,T,1) fp32.
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cudnn_frontend.h>
#include <map>
#include <mutex>
#include <unordered_map>

#include "attention.cuh"
#include "check.cuh"

namespace gpt::kern {

namespace fe = cudnn_frontend;

namespace {
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };
using GraphPtr = std::shared_ptr<fe::graph::Graph>;
using ShapeKey = std::array<int, 4>;

std::shared_ptr<fe::graph::Tensor_attributes> qkv_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          const AttentionShape& s) {
  const int64_t C3 = 3LL * s.NH * s.HS;
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({s.B, s.NH, s.T, s.HS})
                      .set_stride({s.T * C3, s.HS, C3, 1}));
}
std::vector<int64_t> out_stride(const AttentionShape& s) {
  const int64_t C = int64_t(s.NH) * s.HS;
  return {s.T * C, s.HS, C, 1};
}
std::vector<int64_t> stats_stride(const AttentionShape& s) { return {int64_t(s.NH) * s.T, s.T, 1, 1}; }

// kKnobs: each engine's knob values are enumerated from min to max by stride, at most this many a knob
// and this many combinations an engine (the engines for attention have few knobs).
constexpr int kMaxKnobValues = 16;
constexpr size_t kMaxKnobPlans = 64;

void add_knob_plans(fe::graph::Graph& g) {
  int64_t engines = 0;
  if (g.get_engine_count(engines).is_bad()) return;
  for (int64_t e = 0; e < engines; ++e) {
    std::vector<fe::Knob> knobs;
    if (g.get_knobs_for_engine(e, knobs).is_bad()) continue;
    std::vector<std::unordered_map<fe::KnobType_t, int64_t>> combos(1);
    for (const fe::Knob& k : knobs) {
      std::vector<std::unordered_map<fe::KnobType_t, int64_t>> next;
      for (const auto& c : combos) {
        int n = 0;
        for (int64_t v = k.minValue; v <= k.maxValue && n < kMaxKnobValues && next.size() < kMaxKnobPlans;
             v += std::max<int64_t>(1, k.stride), ++n) {
          next.push_back(c);
          next.back()[k.type] = v;
        }
      }
      combos = std::move(next);
    }
    // an engine that cannot run this graph, or a combination it rejects, is left out when plans are built
    for (const auto& c : combos) (void)g.create_execution_plan(e, c);
  }
}

void finish(fe::graph::Graph& g, cudnnHandle_t h, AttentionTune tune) {
  CUDNN_CHECK(g.validate());
  CUDNN_CHECK(g.build_operation_graph(h));
  if (tune == AttentionTune::kHeuristic) {
    CUDNN_CHECK(g.create_execution_plans({fe::HeurMode_t::A}));
    CUDNN_CHECK(g.check_support(h));
    CUDNN_CHECK(g.build_plans(h));
    return;
  }
  CUDNN_CHECK(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  if (tune == AttentionTune::kKnobs) add_knob_plans(g);
  CUDNN_CHECK(g.check_support(h));
  CUDNN_CHECK(g.build_plans(h, fe::BuildPlanPolicy_t::ALL));  // those that fail to build are skipped
}

std::string graph_label(const char* dir, const AttentionShape& s) {
  return std::string(dir) + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " NH=" + std::to_string(s.NH) + " HS=" + std::to_string(s.HS);
}
}  // namespace

struct CudnnAttention::Impl {
  // a built graph and the plan that runs it (-1: the heuristic's, or, when tuning, not chosen yet)
  struct Entry {
    GraphPtr g;
    int64_t plan = -1;
  };
  static constexpr int kTuneReps = 5;

  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
  bool deterministic = true;
  AttentionTune tune = AttentionTune::kHeuristic;
  cudnnHandle_t handle = nullptr;
  std::map<ShapeKey, Entry> fwd, bwd;
  std::vector<AttentionPlanTime> report;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  void reserve(int64_t bytes) {
    if (size_t(bytes) <= ws_bytes) return;
    if (ws) free(ws);  // cudaFree waits for queued work that may still use it
    ws = alloc(size_t(bytes));
    ws_bytes = size_t(bytes);
  }

  // Runs entry's graph on pack. On a tuned graph's first run, first times each built plan (a warm-up
  // run, then the median of kTuneReps) and keeps the fastest. Every output is overwritten by each run,
  // so the extra runs leave the same result.
  void execute(Entry& e, const char* dir, const AttentionShape& sh, std::unordered_map<int64_t, void*>& pack,
               cudaStream_t s) {
    CUDNN_CHECK(cudnnSetStream(handle, s));
    if (tune != AttentionTune::kHeuristic && e.plan < 0) choose(e, graph_label(dir, sh), pack, s);
    if (e.plan < 0)
      CUDNN_CHECK(e.g->execute(handle, pack, ws));
    else
      CUDNN_CHECK(e.g->execute_plan_at_index(handle, pack, ws, e.plan));
  }

  void choose(Entry& e, const std::string& label, std::unordered_map<int64_t, void*>& pack, cudaStream_t s) {
    const int64_t n = e.g->get_execution_plan_count();
    int64_t most = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t bytes = 0;
      if (e.g->get_workspace_size_plan_at_index(i, bytes).is_good()) most = std::max(most, bytes);
    }
    reserve(most);
    cudaEvent_t ev[kTuneReps + 1];
    for (auto& x : ev) CUDA_CHECK(cudaEventCreate(&x));
    std::vector<std::string> seen;
    const size_t first = report.size();
    double best = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      std::string name;
      if (e.g->get_plan_name_at_index(i, name).is_bad()) continue;
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;  // the same config twice
      seen.push_back(name);
      if (e.g->execute_plan_at_index(handle, pack, ws, i).is_bad()) continue;  // not built: unsupported
      CUDA_CHECK(cudaEventRecord(ev[0], s));
      for (int r = 0; r < kTuneReps; ++r) {
        CUDNN_CHECK(e.g->execute_plan_at_index(handle, pack, ws, i));
        CUDA_CHECK(cudaEventRecord(ev[r + 1], s));
      }
      CUDA_CHECK(cudaEventSynchronize(ev[kTuneReps]));
      std::vector<float> ms(kTuneReps);
      for (int r = 0; r < kTuneReps; ++r) CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
      std::sort(ms.begin(), ms.end());
      const double med = ms[kTuneReps / 2];
      report.push_back({label, name, int(i), med, false});
      if (e.plan < 0 || med < best) e.plan = i, best = med;
    }
    for (auto& x : ev) CUDA_CHECK(cudaEventDestroy(x));
    for (size_t k = first; k < report.size(); ++k) report[k].chosen = report[k].rank == e.plan;
    if (e.plan < 0)
      throw KernelError(KernelError::Kind::kUnsupported, "cuDNN attention: no execution plan ran for " + label);
  }

  Entry& fwd_graph(const AttentionShape& s) {
    const ShapeKey key{s.B, s.T, s.NH, s.HS};
    auto it = fwd.find(key);
    if (it != fwd.end()) return it->second;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = qkv_tensor(*g, "Q", kQ, s), K = qkv_tensor(*g, "K", kK, s), V = qkv_tensor(*g, "V", kV, s);
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa_fwd")
                    .set_generate_stats(true)
                    .set_causal_mask(true)
                    .set_attn_scale(1.0f / std::sqrt(float(s.HS)));
    auto [O, S] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(kO).set_dim({s.B, s.NH, s.T, s.HS}).set_stride(out_stride(s));
    S->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.B, s.NH, s.T, 1})
        .set_stride(stats_stride(s));
    finish(*g, handle, tune);
    int64_t bytes = 0;
    CUDNN_CHECK(g->get_workspace_size(bytes));
    reserve(bytes);
    return fwd.emplace(key, Entry{g}).first->second;
  }

  Entry& bwd_graph(const AttentionShape& s) {
    const ShapeKey key{s.B, s.T, s.NH, s.HS};
    auto it = bwd.find(key);
    if (it != bwd.end()) return it->second;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = qkv_tensor(*g, "Q", kQ, s), K = qkv_tensor(*g, "K", kK, s), V = qkv_tensor(*g, "V", kV, s);
    auto O = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("O")
                           .set_uid(kO)
                           .set_dim({s.B, s.NH, s.T, s.HS})
                           .set_stride(out_stride(s)));
    auto dO = g->tensor(fe::graph::Tensor_attributes()
                            .set_name("dO")
                            .set_uid(kDO)
                            .set_dim({s.B, s.NH, s.T, s.HS})
                            .set_stride(out_stride(s)));
    auto St = g->tensor(fe::graph::Tensor_attributes()
                            .set_name("Stats")
                            .set_uid(kStats)
                            .set_dim({s.B, s.NH, s.T, 1})
                            .set_stride(stats_stride(s))
                            .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_bwd")
                    .set_causal_mask(true)
                    .set_attn_scale(1.0f / std::sqrt(float(s.HS)))
                    .set_deterministic_algorithm(deterministic);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, St, opts);
    const int64_t C3 = 3LL * s.NH * s.HS;
    const std::vector<int64_t> qkv_stride{s.T * C3, s.HS, C3, 1};
    dQ->set_output(true).set_uid(kDQ).set_dim({s.B, s.NH, s.T, s.HS}).set_stride(qkv_stride);
    dK->set_output(true).set_uid(kDK).set_dim({s.B, s.NH, s.T, s.HS}).set_stride(qkv_stride);
    dV->set_output(true).set_uid(kDV).set_dim({s.B, s.NH, s.T, s.HS}).set_stride(qkv_stride);
    finish(*g, handle, tune);
    int64_t bytes = 0;
    CUDNN_CHECK(g->get_workspace_size(bytes));
    reserve(bytes);
    return bwd.emplace(key, Entry{g}).first->second;
  }
};

CudnnAttention::CudnnAttention(std::function<void*(size_t)> alloc, std::function<void(void*)> free,
                               bool deterministic, AttentionTune tune)
    : impl_(std::make_unique<Impl>()) {
  impl_->alloc = std::move(alloc);
  impl_->free = std::move(free);
  impl_->deterministic = deterministic;
  impl_->tune = tune;
  CUDNN_CHECK(cudnnCreate(&impl_->handle));
}

CudnnAttention::~CudnnAttention() {
  impl_->fwd.clear();
  impl_->bwd.clear();
  if (impl_->ws) impl_->free(impl_->ws);
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

void CudnnAttention::fwd(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const AttentionShape& sh,
                         cudaStream_t s) {
  Impl::Entry& e = impl_->fwd_graph(sh);
  const size_t C = size_t(sh.NH) * sh.HS;
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base}, {kK, base + C}, {kV, base + 2 * C}, {kO, out}, {kStats, lse}};
  impl_->execute(e, "fwd", sh, pack, s);
}

void CudnnAttention::bwd(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                         const __nv_bfloat16* out, const float* lse, const AttentionShape& sh, cudaStream_t s) {
  Impl::Entry& e = impl_->bwd_graph(sh);
  const size_t C = size_t(sh.NH) * sh.HS;
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::unordered_map<int64_t, void*> pack = {{kQ, base},
                                             {kK, base + C},
                                             {kV, base + 2 * C},
                                             {kO, const_cast<__nv_bfloat16*>(out)},
                                             {kDO, const_cast<__nv_bfloat16*>(dout)},
                                             {kStats, const_cast<float*>(lse)},
                                             {kDQ, dqkv},
                                             {kDK, dqkv + C},
                                             {kDV, dqkv + 2 * C}};
  impl_->execute(e, "bwd", sh, pack, s);
}

const std::vector<AttentionPlanTime>& CudnnAttention::tuning() const { return impl_->report; }

}  // namespace gpt::kern
