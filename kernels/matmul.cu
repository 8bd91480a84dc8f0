// Matmuls through cuBLASLt, plus the deterministic bias-gradient reduction.
//
// Row-major to column-major: a row-major (r, c) matrix is a column-major (c, r) one. So
//   forward   out (N,OC) = inp (N,IC) @ w (OC,IC)^T   is  D (OC x N) = op_T(w: IC x OC) * inp (IC x N)
//   dinp      (N,IC)    = dout (N,OC) @ w (OC,IC)    is  D (IC x N) = w (IC x OC) * dout (OC x N)
//   dw        (OC,IC)  += dout^T @ inp               is  D (IC x OC) += inp (IC x N) * op_T(dout: OC x N)
// The bias of the forward epilogue runs along m = OC, as the model wants. GELU is fused as
// GELU_AUX(_BIAS) (pre-activation written to aux) and its gradient as DGELU (aux read back); shapes the
// epilogue cannot take (aux ld not a multiple of 8, or no algorithm) fall back to separate kernels.
// bf16: bf16 in/out, fp32 accumulate. fp32: TF32 tensor cores, fp32 accumulate.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "matmul.cuh"

#include "activation.cuh"

namespace gpt::kern {

struct CublasLt::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  // C's layout where D is FP8 (C keeps the activation dtype, and is not read: beta is 0 and C null); else ld
  cublasLtMatrixLayout_t lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  cublasLtMatrixLayout_t c_layout() const { return lc ? lc : ld; }
  ~Plan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

CublasLt::CublasLt(cudaDataType_t dtype, void* workspace, size_t workspace_bytes, bool autotune, double search_s)
    : dtype_(dtype),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      autotune_(autotune),
      search_s_(search_s) {
  cublasLtHandle_t h = nullptr;
  CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
}
CublasLt::~CublasLt() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

namespace {
// largest power of two (up to 256) dividing the address: the alignment the heuristic may assume
long long ptr_align(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  long long r = 256;
  while (r > 1 && a % r) r /= 2;
  return r;
}
KernelError no_algorithm(const char* product) {
  return KernelError(KernelError::Kind::kUnsupported, std::string("cuBLASLt: no algorithm for the ") + product +
                                                          " matmul");
}
cublasLtEpilogue_t to_lt(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::GeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
// The configurations worth timing. The heuristic's candidates come first. For a big product (search)
// the configurations around them follow, unchecked: for each algorithm id and stage count the heuristic
// offered, the id's tile sizes crossed with the thread-block cluster shapes (auto, 1x1, 2x1, 1x2) and
// the id's first four custom options; the variants of the heuristic's own tiles first, then the other
// tiles in a fixed shuffled order. On an H200 the heuristic's list misses configurations 4-15% faster
// for several of GPT-2's products (build/bench/gemm_algos --exhaustive; 2-5% over all of a step's
// products at the power limit), all of them of this kind.
constexpr double kSearchMinFlops = 1e10;  // smaller products: the heuristic's candidates only
struct Candidates {
  std::vector<cublasLtMatmulAlgo_t> heuristic, variants;
};
// types: A, B, C and D's (an FP8 product's operands and output differ from C's)
Candidates candidates(cublasLtHandle_t handle, cublasComputeType_t ct, const std::array<cudaDataType_t, 4>& types,
                      size_t workspace_bytes, const cublasLtMatmulHeuristicResult_t* res, int found, bool search,
                      const GemmArgs& g) {
  Candidates out;
  for (int i = 0; i < found; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= workspace_bytes)
      out.heuristic.push_back(res[i].algo);
  if (!search) return out;
  auto get = [](const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &w);
    return v;
  };
  std::vector<std::pair<uint32_t, uint32_t>> seen;  // (algorithm id, stages id)
  std::vector<cublasLtMatmulAlgo_t> near, far;      // variants of the heuristic's tiles; of the others
  for (const cublasLtMatmulAlgo_t& h : out.heuristic) {
    const uint32_t id = get(h, CUBLASLT_ALGO_CONFIG_ID), stages = get(h, CUBLASLT_ALGO_CONFIG_STAGES_ID);
    if (std::find(seen.begin(), seen.end(), std::make_pair(id, stages)) != seen.end()) continue;
    seen.emplace_back(id, stages);
    cublasLtMatmulAlgo_t base;
    if (cublasLtMatmulAlgoInit(handle, ct, CUDA_R_32F, types[0], types[1], types[2], types[3], int(id), &base) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    size_t bytes = 0, w = 0;
    bool aligned = true;  // the operands' addresses meet the id's alignment needs
    const std::pair<cublasLtMatmulAlgoCapAttributes_t, long long> needs[] = {
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, ptr_align(g.A)},
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES, ptr_align(g.B)},
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, ptr_align(g.D)},
        {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES, ptr_align(g.D)}};
    for (const auto& [cap, have] : needs) {
      uint32_t need = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, cap, &need, sizeof need, &w);
      aligned = aligned && need <= have;
    }
    if (!aligned) continue;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes);
    std::vector<uint32_t> tiles(bytes / sizeof(uint32_t));
    if (tiles.empty()) continue;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &bytes);
    int custom_max = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max, &w);
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1};
    for (uint32_t tile : tiles) {
      bool own = false;
      for (const cublasLtMatmulAlgo_t& o : out.heuristic)
        own = own || (get(o, CUBLASLT_ALGO_CONFIG_ID) == id && get(o, CUBLASLT_ALGO_CONFIG_TILE_ID) == tile);
      for (uint16_t cluster : clusters)
        for (uint32_t custom = 0; custom <= uint32_t(std::min(custom_max, 3)); ++custom) {
          cublasLtMatmulAlgo_t a = base;
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages);
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster);
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom);
          (own ? near : far).push_back(a);
        }
    }
  }
  std::shuffle(far.begin(), far.end(), std::mt19937(1));
  out.variants = std::move(near);
  out.variants.insert(out.variants.end(), far.begin(), far.end());
  return out;
}

// The fastest candidate, timed on the call's own operands. Without a search, each of the heuristic's
// candidates kReps times after a warm-up. With one, every heuristic candidate once after a warm-up, then
// the variants cuBLASLt accepts (cublasLtMatmulAlgoCheck) the same way for up to search_s seconds, then
// the kFinalists fastest of all kReps times. An accumulating product's output is saved first and
// restored after, and its aux/GELU outputs are rewritten by the real call that follows, so timing
// changes no result. The heuristic's first choice when there is nothing to choose from or no memory
// for the saved output.
cublasLtMatmulAlgo_t fastest(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                             cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                             size_t elem_bytes, void* workspace, size_t workspace_bytes, const GemmArgs& g,
                             const Candidates& cands, double search_s, cudaStream_t s) {
  if (cands.heuristic.size() <= 1 && cands.variants.empty()) return cands.heuristic[0];
  constexpr int kReps = 3;
  constexpr size_t kFinalists = 8;
  const size_t d_bytes = size_t(g.ldd) * g.n * elem_bytes;
  void* saved = nullptr;
  if (g.accumulate) {
    if (cudaMallocAsync(&saved, d_bytes, s) != cudaSuccess) {
      cudaGetLastError();
      return cands.heuristic[0];
    }
    CUDA_CHECK(cudaMemcpyAsync(saved, g.D, d_bytes, cudaMemcpyDeviceToDevice, s));
  }
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  // ms per run over `reps` runs after one warm-up; negative when the library refuses the configuration
  auto time = [&](const cublasLtMatmulAlgo_t& algo, int reps) {
    for (int r = 0; r <= reps; ++r) {
      if (r == 1) CUDA_CHECK(cudaEventRecord(e0, s));
      if (cublasLtMatmul(handle, desc, &alpha, g.A, la, g.B, lb, &beta, lc == ld ? g.D : nullptr, lc, g.D, ld, &algo,
                         workspace, workspace_bytes, s) != CUBLAS_STATUS_SUCCESS)
        return -1.0f;
    }
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / reps;
  };
  std::vector<std::pair<float, const cublasLtMatmulAlgo_t*>> first;  // (ms, candidate)
  for (const cublasLtMatmulAlgo_t& a : cands.heuristic) {
    const float ms = cands.variants.empty() ? 0.0f : time(a, 1);  // no search: every one is a finalist
    if (ms >= 0) first.emplace_back(ms, &a);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (const cublasLtMatmulAlgo_t& a : cands.variants) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > search_s) break;
    cublasLtMatmulHeuristicResult_t chk{};
    if (cublasLtMatmulAlgoCheck(handle, desc, la, lb, lc, ld, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
        chk.state != CUBLAS_STATUS_SUCCESS || chk.workspaceSize > workspace_bytes)
      continue;
    const float ms = time(a, 1);
    if (ms >= 0) first.emplace_back(ms, &a);
  }
  cudaGetLastError();  // a refused configuration may leave an error behind
  std::sort(first.begin(), first.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  if (!cands.variants.empty() && first.size() > kFinalists) first.resize(kFinalists);
  const cublasLtMatmulAlgo_t* best = &cands.heuristic[0];
  float best_ms = -1;
  for (const auto& f : first) {
    const float ms = time(*f.second, kReps);
    if (ms >= 0 && (best_ms < 0 || ms < best_ms)) best = f.second, best_ms = ms;
  }
  if (saved) {
    CUDA_CHECK(cudaMemcpyAsync(g.D, saved, d_bytes, cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaFreeAsync(saved, s));
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return *best;
}

// An FP8 output: D = fp8(result * d_scale), max |result| written to d_amax
void set_fp8_out(cublasLtMatmulDesc_t desc, const GemmArgs& g) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &g.d_scale, sizeof(void*)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &g.d_amax, sizeof(void*)));
}

}  // namespace

bool CublasLt::gemm(const GemmArgs& g, cudaStream_t s) {
  const Key key = {g.transa, g.transb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.accumulate, int(g.epi), g.aux_ld,
                   ptr_align(g.A), ptr_align(g.B), ptr_align(g.D), ptr_align(g.aux), ptr_align(g.bias),
                   g.a_type, g.b_type, g.fast_accum, g.d_type};
  const bool fp8 = g.a_type >= 0, fp8_out = g.d_type >= 0;
  if (fp8_out && g.accumulate) return false;  // C would have to be read in D's type
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto p = std::make_unique<Plan>();
    const bool f32 = dtype_ == CUDA_R_32F;
    const cudaDataType_t dt = f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t at = fp8 ? cudaDataType_t(g.a_type) : dt, bt = fp8 ? cudaDataType_t(g.b_type) : dt;
    const cublasComputeType_t ct = f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F));
    const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const cublasLtEpilogue_t epi = to_lt(g.epi);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (fp8) {
      const int8_t fast = g.fast_accum ? 1 : 0;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale,
                                                  sizeof(void*)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale,
                                                  sizeof(void*)));
      if (g.bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof(dt)));
      if (g.aux)
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &dt, sizeof(dt)));
    }
    if (fp8_out) set_fp8_out(p->desc, g);
    if (g.bias)
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(void*)));
    if (g.aux) {
      const int64_t ld = g.aux_ld;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                  sizeof(void*)));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, at, g.transa ? g.k : g.m, g.transa ? g.m : g.k, g.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, bt, g.transb ? g.n : g.k, g.transb ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, fp8_out ? cudaDataType_t(g.d_type) : dt, g.m, g.n, g.ldd));
    if (fp8_out) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, dt, g.m, g.n, g.ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof(workspace_bytes_)));
    const uint32_t aa = uint32_t(ptr_align(g.A)), ab = uint32_t(ptr_align(g.B)), ad = uint32_t(ptr_align(g.D));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, 4));
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t res[kCandidates] = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->la, p->lb, p->c_layout(), p->ld,
                                                             pref, autotune_ ? kCandidates : 1, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
    p->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->ok) {
      const bool search = autotune_ && search_s_ > 0 && 2.0 * g.m * g.n * g.k >= kSearchMinFlops;
      const cudaDataType_t d_t = fp8_out ? cudaDataType_t(g.d_type) : dt;
      const Candidates cands = candidates(handle_, ct, {at, bt, dt, d_t}, workspace_bytes_, res, found, search, g);
      p->ok = !cands.heuristic.empty();
      if (p->ok)
        p->algo = fastest(handle_, p->desc, p->la, p->lb, p->c_layout(), p->ld, fp8_out ? 1 : f32 ? 4 : 2, workspace_,
                          workspace_bytes_, g, cands, search_s_, s);
    }
    it = plans_.emplace(key, std::move(p)).first;
  }
  Plan& p = *it->second;
  if (!p.ok) return false;
  if (g.bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(void*)));
  if (g.aux)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(void*)));
  if (fp8) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof(void*)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof(void*)));
  }
  if (fp8_out) set_fp8_out(p.desc, g);
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t st = cublasLtMatmul(handle_, p.desc, &alpha, g.A, p.la, g.B, p.lb, &beta, p.lc ? nullptr : g.D,
                                           p.c_layout(), g.D, p.ld, &p.algo, workspace_, workspace_bytes_, s);
  if (st != CUBLAS_STATUS_SUCCESS && fp8_out) {  // an FP8 output the library lists but refuses: fall back
    p.ok = false;
    return false;
  }
  CUBLAS_CHECK(st);
  return true;
}

// ---- bias gradient: dbias (OC) += sum_n dout (N, OC)
// Two launches: partial column sums over S row splits into fp32 scratch, then their sum in a fixed
// order (deterministic). cuBLASLt's BGRADB epilogue on the dW product (into fp32 scratch, then an add)
// measured no faster at GPT-2 124M. Both kernels are latency-bound unless many loads are in flight:
// the partial kernel issues kUnroll independent row loads before summing them, and the reduction
// (add_partial_rows_kernel, common.cuh) spreads each column's S partials over 32 threads instead of
// looping over them in one.
namespace {
constexpr int kRowsY = 8;    // partial kernel: block = 32 x kRowsY threads
constexpr int kUnroll = 4;   // rows loaded before they are summed
constexpr int kBlocksPerSm = 6;

// grid (column tiles of 32*V, S row splits). Thread (x, y) of split s sums V columns over rows
// s*kRowsY + y, stepping by S*kRowsY; the kRowsY partials are combined in a fixed order and the block
// writes part[s][col].
template <class X, int V>
__global__ void __launch_bounds__(32 * kRowsY) bias_grad_partial_kernel(float* __restrict__ part,
                                                                        const X* __restrict__ dout, int N, int OC) {
  __shared__ float sh[kRowsY][32 * V + 1];
  const int c = (blockIdx.x * 32 + threadIdx.x) * V;
  const int step = gridDim.y * kRowsY;
  float acc[V] = {};
  if (c < OC) {
    int r = blockIdx.y * kRowsY + threadIdx.y;
    for (; r + (kUnroll - 1) * step < N; r += kUnroll * step) {
      Vec<X, V> g[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) g[u] = ldv<X, V>(dout + size_t(r + u * step) * OC + c);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_f(g[u].v[k]);
    }
    for (; r < N; r += step) {
      const Vec<X, V> g = ldv<X, V>(dout + size_t(r) * OC + c);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += to_f(g.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sh[threadIdx.y][threadIdx.x * V + k] = acc[k];
  __syncthreads();
  for (int j = threadIdx.y * 32 + threadIdx.x; j < 32 * V; j += 32 * kRowsY) {
    const int col = blockIdx.x * 32 * V + j;
    if (col >= OC) continue;
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < kRowsY; ++y) s += sh[y][j];
    part[size_t(blockIdx.y) * OC + col] = s;
  }
}
// row splits: enough blocks for kBlocksPerSm on every SM, each thread with at least one unrolled batch
int bias_splits(int N, int OC, int V, int num_sms) {
  const long tiles = ceil_div(OC, 32L * V);
  const long want = std::max<long>(1, long(kBlocksPerSm) * num_sms / tiles);
  return int(std::max<long>(1, std::min<long>({want, ceil_div(N, long(kUnroll) * kRowsY), 1024L})));
}
}  // namespace

size_t bias_grad_scratch_bytes(int N, int OC, int num_sms) {
  // the split count depends on the vector width chosen at launch: reserve for the larger
  const int S = std::max(bias_splits(N, OC, 1, num_sms), bias_splits(N, OC, 16, num_sms));
  return size_t(S) * OC * sizeof(float);
}

template <class X>
void bias_grad(X* dbias, const X* dout, int N, int OC, float* scratch, int num_sms, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const bool vec = OC % V == 0 && is_aligned(dout, 16);
  const int v = vec ? V : 1;
  const int S = bias_splits(N, OC, v, num_sms);
  const dim3 grid(unsigned(ceil_div(OC, 32L * v)), unsigned(S)), block(32, kRowsY);
  if (vec)
    bias_grad_partial_kernel<X, V><<<grid, block, 0, s>>>(scratch, dout, N, OC);
  else
    bias_grad_partial_kernel<X, 1><<<grid, block, 0, s>>>(scratch, dout, N, OC);
  CUDA_CHECK_LAUNCH();
  add_partial_rows_kernel<X><<<partial_rows_grid(OC), dim3(32, 32), 0, s>>>(dbias, nullptr, OC, scratch, S, OC, OC);
  CUDA_CHECK_LAUNCH();
}
template void bias_grad<float>(float*, const float*, int, int, float*, int, cudaStream_t);
template void bias_grad<bf16>(bf16*, const bf16*, int, int, float*, int, cudaStream_t);

// ---- the model's matmuls
template <class X>
void matmul_fwd(CublasLt& lt, const MatmulFwdArgs& a, cudaStream_t s) {
  GemmArgs g;
  g.transa = true;
  g.m = a.OC, g.n = a.N, g.k = a.IC;
  g.A = a.w, g.lda = a.IC;
  g.B = a.inp, g.ldb = a.IC;
  g.ldd = a.OC;
  g.bias = a.bias;
  if (a.pre_gelu) {
    if (a.OC % 8 == 0) {  // cuBLASLt wants the aux ld divisible by 8
      GemmArgs f = g;
      f.D = a.out;
      f.epi = a.bias ? Epilogue::GeluAuxBias : Epilogue::GeluAux;
      f.aux = a.pre_gelu, f.aux_ld = a.OC;
      if (lt.gemm(f, s)) return;
    }
    g.D = a.pre_gelu;
    g.epi = a.bias ? Epilogue::Bias : Epilogue::None;
    if (!lt.gemm(g, s)) throw no_algorithm("forward");
    gelu_fwd<X>(static_cast<X*>(a.out), static_cast<const X*>(a.pre_gelu), size_t(a.N) * a.OC, s);
    return;
  }
  g.D = a.out;
  g.epi = a.bias ? Epilogue::Bias : Epilogue::None;
  if (!lt.gemm(g, s)) throw no_algorithm("forward");
}

template <class X>
void matmul_bwd(CublasLt& lt, const MatmulBwdArgs& a, cudaStream_t s) {
  if (a.dinp) {
    GemmArgs g;
    g.m = a.IC, g.n = a.N, g.k = a.OC;
    g.A = a.w, g.lda = a.IC;
    g.B = a.dout, g.ldb = a.OC;
    g.D = a.dinp, g.ldd = a.IC;
    bool done = false;
    if (a.pre_gelu && a.IC % 8 == 0) {
      GemmArgs f = g;
      f.epi = Epilogue::DGelu;
      f.aux = const_cast<void*>(a.pre_gelu), f.aux_ld = a.IC;
      done = lt.gemm(f, s);
    }
    if (!done) {
      if (!lt.gemm(g, s)) throw no_algorithm("dinp");
      if (a.pre_gelu)
        gelu_bwd_inplace<X>(static_cast<X*>(a.dinp), static_cast<const X*>(a.pre_gelu), size_t(a.N) * a.IC, s);
    }
  }
  if (a.dw) {
    GemmArgs g;
    g.transb = true;
    g.m = a.IC, g.n = a.OC, g.k = a.N;
    g.A = a.inp, g.lda = a.IC;
    g.B = a.dout, g.ldb = a.OC;
    g.D = a.dw, g.ldd = a.IC;
    g.accumulate = true;
    if (!lt.gemm(g, s)) throw no_algorithm("dweight");
  }
  if (a.dbias && a.dout_colsum) {  // dbias += the sums given: one partial row
    add_partial_rows_kernel<X><<<partial_rows_grid(a.OC), dim3(32, 32), 0, s>>>(static_cast<X*>(a.dbias), nullptr,
                                                                               a.OC, a.dout_colsum, 1, a.OC, a.OC);
    CUDA_CHECK_LAUNCH();
  } else if (a.dbias) {
    bias_grad<X>(static_cast<X*>(a.dbias), static_cast<const X*>(a.dout), a.N, a.OC, a.scratch, a.num_sms, s);
  }
}

template void matmul_fwd<float>(CublasLt&, const MatmulFwdArgs&, cudaStream_t);
template void matmul_fwd<bf16>(CublasLt&, const MatmulFwdArgs&, cudaStream_t);
template void matmul_bwd<float>(CublasLt&, const MatmulBwdArgs&, cudaStream_t);
template void matmul_bwd<bf16>(CublasLt&, const MatmulBwdArgs&, cudaStream_t);

}  // namespace gpt::kern
