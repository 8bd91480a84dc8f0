// LayerNorm (eps 1e-5). Forward: one warp per row, three passes over the row (mean, centred variance,
// normalise); the second and third hit L1. The residual variant computes residual = a + b in pass one,
// rounds it to X, stores it and normalises the stored value (what the backward pass will see).
// Backward, deterministic: each warp owns a private fp32 dw/db slice in shared memory; a block sums its
// warps in a fixed order into its own row of a scratch buffer, and a second kernel sums the blocks'
// rows in a fixed order into dw/db.
#include "cuda/cuda_check.cuh"
#include "ops.cuh"

namespace gpt::kern {

namespace {
constexpr float kEps = 1e-5f;
constexpr int kFwdWarps = 8;
constexpr int kBwdMaxWarps = 8;          // per block
constexpr size_t kBwdSmemPerSm = 220 * 1024;  // of the 228 KB an SM has, leaving room for the runtime

template <class X, int V, bool RESID>
__global__ void __launch_bounds__(kFwdWarps * 32) layernorm_fwd_kernel(LayerNormFwdArgs<X> a) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kFwdWarps + threadIdx.x / 32;
  if (row >= a.N) return;
  const int C = a.C;
  const size_t off = size_t(row) * C;
  // in residual mode x is this lane's own earlier stores: plain loads, never the read-only path
  const X* x = RESID ? a.residual + off : a.inp + off;

  float sum = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    Vec<X, V> xv;
    if constexpr (RESID) {
      const Vec<X, V> av = ldv<X, V>(a.a + off + c), bv = ldv<X, V>(a.b + off + c);
#pragma unroll
      for (int k = 0; k < V; ++k) xv.v[k] = from_f<X>(to_f(av.v[k]) + to_f(bv.v[k]));
      stv<X, V>(a.residual + off + c, xv);
    } else {
      xv = ldv<X, V>(x + c);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) sum += to_f(xv.v[k]);
  }
  const float mean = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<X, V> xv = ldv<X, V>(x + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = to_f(xv.v[k]) - mean;
      var += d * d;
    }
  }
  const float rstd = rsqrtf(warp_sum(var) / C + kEps);
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<X, V> xv = ldv<X, V>(x + c), wv = ldv<X, V>(a.w + c), bv = ldv<X, V>(a.bias + c);
    Vec<X, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_f<X>((to_f(xv.v[k]) - mean) * rstd * to_f(wv.v[k]) + to_f(bv.v[k]));
    stv<X, V>(a.out + off + c, o);
  }
  if (lane == 0) {
    if (a.mean) a.mean[row] = mean;
    if (a.rstd) a.rstd[row] = rstd;
  }
}

// grid: G blocks of nw warps (chosen so the warps' shared memory fills the SM); rows are dealt out
// warp by warp across the grid.
// Dynamic shared memory: per warp, dw then db, each padded to Cp = ceil(C / (32 V)) * 32 V floats.
// Element c = (j * 32 + lane) * V + k lives at ((j * V + k) * 32 + lane): a warp's 32 lanes touch 32
// consecutive words, free of bank conflicts.
__host__ __device__ inline int padded_c(int C, int V) { return (C + 32 * V - 1) / (32 * V) * (32 * V); }

template <class X, int V>
__global__ void __launch_bounds__(kBwdMaxWarps * 32) layernorm_bwd_kernel(LayerNormBwdArgs<X> a) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  const int C = a.C, Cp = padded_c(C, V);
  float* sdw = smem + size_t(warp) * 2 * Cp;
  float* sdb = sdw + Cp;
  for (int i = lane; i < 2 * Cp; i += 32) sdw[i] = 0.0f;  // own slice only: no barrier needed yet
  __syncwarp();

  for (int row = blockIdx.x * nw + warp; row < a.N; row += gridDim.x * nw) {
    const size_t off = size_t(row) * C;
    const float mean = a.mean[row], rstd = a.rstd[row];
    float s_dn = 0.0f, s_dnx = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
      const Vec<X, V> g = ldv<X, V>(a.dout + off + c), x = ldv<X, V>(a.inp + off + c), w = ldv<X, V>(a.w + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float dn = to_f(g.v[k]) * to_f(w.v[k]);
        s_dn += dn;
        s_dnx += dn * (to_f(x.v[k]) - mean) * rstd;
      }
    }
    s_dn = warp_sum(s_dn) / C;
    s_dnx = warp_sum(s_dnx) / C;
    for (int c = lane * V, j = 0; c < C; c += 32 * V, ++j) {
      const Vec<X, V> g = ldv<X, V>(a.dout + off + c), x = ldv<X, V>(a.inp + off + c), w = ldv<X, V>(a.w + c);
      Vec<X, V> di = ldv<X, V>(a.dinp + off + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gk = to_f(g.v[k]);
        const float xhat = (to_f(x.v[k]) - mean) * rstd;
        const float dn = gk * to_f(w.v[k]);
        di.v[k] = from_f<X>(to_f(di.v[k]) + (dn - s_dn - xhat * s_dnx) * rstd);
        const int sidx = (j * V + k) * 32 + lane;
        sdw[sidx] += gk * xhat;
        sdb[sidx] += gk;
      }
      stv<X, V>(a.dinp + off + c, di);
    }
  }
  __syncthreads();
  float* part = a.scratch + size_t(blockIdx.x) * 2 * C;
  for (int i = threadIdx.x; i < 2 * Cp; i += blockDim.x) {
    const int which = i / Cp, sidx = i % Cp;  // 0: dw, 1: db
    const int ln = sidx % 32, t = sidx / 32, j = t / V, k = t % V;
    const int c = (j * 32 + ln) * V + k;
    if (c >= C) continue;
    float acc = 0.0f;
    for (int w = 0; w < nw; ++w) acc += smem[size_t(w) * 2 * Cp + i];
    part[which * C + c] = acc;
  }
}

template <class X>
__global__ void layernorm_bwd_reduce_kernel(X* __restrict__ dw, X* __restrict__ db, const float* __restrict__ part,
                                            int blocks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= 2 * C) return;
  float acc = 0.0f;
  for (int b = 0; b < blocks; ++b) acc += part[size_t(b) * 2 * C + c];
  X* dst = c < C ? dw + c : db + (c - C);
  *dst = from_f<X>(to_f(*dst) + acc);
}

struct BwdGrid {
  int warps, blocks;
};
// Warps per SM as the per-warp shared memory allows (at most 32), split into blocks of 4..8 warps
// wasting the fewest: C = 768 bf16 gives 4 blocks of 8, C = 1600 gives 3 blocks of 5.
BwdGrid bwd_grid(int N, int C, int num_sms) {
  const size_t per_warp = 2 * size_t(padded_c(C, 8)) * sizeof(float);  // the widest padding
  const int fit = int(std::min<size_t>(32, std::max<size_t>(1, kBwdSmemPerSm / per_warp)));
  int best = std::min(fit, 4), best_used = best * (fit / best);
  for (int w = 5; w <= kBwdMaxWarps; ++w)
    if (w <= fit && w * (fit / w) >= best_used) best = w, best_used = w * (fit / w);
  const long blocks = std::min<long>(long(num_sms) * (fit / best), ceil_div(N, best));
  return {best, int(std::max<long>(1, blocks))};
}
}  // namespace

template <class X>
void layernorm_fwd(const LayerNormFwdArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const bool resid = a.residual != nullptr;
  bool vec = a.C % V == 0 && is_aligned(a.out, 16) && is_aligned(a.w, 16) && is_aligned(a.bias, 16);
  if (resid)
    vec = vec && is_aligned(a.residual, 16) && is_aligned(a.a, 16) && is_aligned(a.b, 16);
  else
    vec = vec && is_aligned(a.inp, 16);
  const unsigned grid = unsigned(ceil_div(a.N, kFwdWarps));
  const unsigned block = kFwdWarps * 32;
  if (resid) {
    if (vec)
      layernorm_fwd_kernel<X, V, true><<<grid, block, 0, s>>>(a);
    else
      layernorm_fwd_kernel<X, 1, true><<<grid, block, 0, s>>>(a);
  } else {
    if (vec)
      layernorm_fwd_kernel<X, V, false><<<grid, block, 0, s>>>(a);
    else
      layernorm_fwd_kernel<X, 1, false><<<grid, block, 0, s>>>(a);
  }
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_bwd_scratch_bytes(int N, int C, int num_sms) {
  return size_t(bwd_grid(N, C, num_sms).blocks) * 2 * C * sizeof(float);
}

template <class X>
void layernorm_bwd(const LayerNormBwdArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const bool vec = a.C % V == 0 && is_aligned(a.dinp, 16) && is_aligned(a.dout, 16) && is_aligned(a.inp, 16) &&
                   is_aligned(a.w, 16);
  const BwdGrid grid = bwd_grid(a.N, a.C, a.num_sms);
  const int blocks = grid.blocks;
  const size_t smem = size_t(grid.warps) * 2 * padded_c(a.C, vec ? V : 1) * sizeof(float);
  if (vec) {
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_kernel<X, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    layernorm_bwd_kernel<X, V><<<blocks, grid.warps * 32, smem, s>>>(a);
  } else {
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_kernel<X, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    layernorm_bwd_kernel<X, 1><<<blocks, grid.warps * 32, smem, s>>>(a);
  }
  CUDA_CHECK_LAUNCH();
  layernorm_bwd_reduce_kernel<X><<<unsigned(ceil_div(2 * a.C, 256)), 256, 0, s>>>(a.dw, a.db, a.scratch, blocks, a.C);
  CUDA_CHECK_LAUNCH();
}

template void layernorm_fwd<float>(const LayerNormFwdArgs<float>&, cudaStream_t);
template void layernorm_fwd<bf16>(const LayerNormFwdArgs<bf16>&, cudaStream_t);
template void layernorm_bwd<float>(const LayerNormBwdArgs<float>&, cudaStream_t);
template void layernorm_bwd<bf16>(const LayerNormBwdArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
