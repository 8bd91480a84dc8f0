// cuDNN flash attention (see attention.cuh). The packed qkv buffer (B,T,3,NH,HS) is described to cuDNN
// as three (B,NH,T,HS) tensors with strides (T*3C, HS, 3C, 1) and offsets 0, C, 2C: no permute copies.
// out/dout (B,T,NH,HS) are (B,NH,T,HS) tensors with strides (T*C, HS, C, 1). Stats (B,NH,T,1) fp32.
#include <cudnn.h>

#include <array>
#include <cmath>
#include <cudnn_frontend.h>
#include <map>
#include <mutex>
#include <unordered_map>

#include "attention.cuh"
#include "cuda/cuda_check.cuh"

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

void finish(fe::graph::Graph& g, cudnnHandle_t h) {
  CUDNN_CHECK(g.validate());
  CUDNN_CHECK(g.build_operation_graph(h));
  CUDNN_CHECK(g.create_execution_plans({fe::HeurMode_t::A}));
  CUDNN_CHECK(g.check_support(h));
  CUDNN_CHECK(g.build_plans(h));
}
}  // namespace

struct CudnnAttention::Impl {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
  bool deterministic = true;
  cudnnHandle_t handle = nullptr;
  std::map<ShapeKey, GraphPtr> fwd, bwd;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  void reserve(int64_t bytes) {
    if (size_t(bytes) <= ws_bytes) return;
    if (ws) free(ws);  // cudaFree waits for queued work that may still use it
    ws = alloc(size_t(bytes));
    ws_bytes = size_t(bytes);
  }

  GraphPtr fwd_graph(const AttentionShape& s) {
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
    finish(*g, handle);
    int64_t bytes = 0;
    CUDNN_CHECK(g->get_workspace_size(bytes));
    reserve(bytes);
    fwd.emplace(key, g);
    return g;
  }

  GraphPtr bwd_graph(const AttentionShape& s) {
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
    finish(*g, handle);
    int64_t bytes = 0;
    CUDNN_CHECK(g->get_workspace_size(bytes));
    reserve(bytes);
    bwd.emplace(key, g);
    return g;
  }
};

CudnnAttention::CudnnAttention(std::function<void*(size_t)> alloc, std::function<void(void*)> free,
                               bool deterministic)
    : impl_(std::make_unique<Impl>()) {
  impl_->alloc = std::move(alloc);
  impl_->free = std::move(free);
  impl_->deterministic = deterministic;
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
  GraphPtr g = impl_->fwd_graph(sh);
  const size_t C = size_t(sh.NH) * sh.HS;
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, base}, {kK, base + C}, {kV, base + 2 * C}, {kO, out}, {kStats, lse}};
  CUDNN_CHECK(cudnnSetStream(impl_->handle, s));
  CUDNN_CHECK(g->execute(impl_->handle, pack, impl_->ws));
}

void CudnnAttention::bwd(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                         const __nv_bfloat16* out, const float* lse, const AttentionShape& sh, cudaStream_t s) {
  GraphPtr g = impl_->bwd_graph(sh);
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
  CUDNN_CHECK(cudnnSetStream(impl_->handle, s));
  CUDNN_CHECK(g->execute(impl_->handle, pack, impl_->ws));
}

}  // namespace gpt::kern
