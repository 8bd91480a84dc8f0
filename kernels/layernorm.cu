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
constexpr int kBwdWarps = 8;

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

// grid: G blocks, each kBwdWarps warps; rows are dealt out warp by warp across the grid.
// dynamic shared memory: kBwdWarps * 2 * C floats (per warp: dw then db).
template <class X, int V>
__global__ void __launch_bounds__(kBwdWarps * 32) layernorm_bwd_kernel(LayerNormBwdArgs<X> a) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int C = a.C;
  float* sdw = smem + size_t(warp) * 2 * C;
  float* sdb = sdw + C;
  for (int c = lane; c < 2 * C; c += 32) sdw[c] = 0.0f;  // own slice only: no barrier needed yet
  __syncwarp();

  for (int row = blockIdx.x * kBwdWarps + warp; row < a.N; row += gridDim.x * kBwdWarps) {
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
    for (int c = lane * V; c < C; c += 32 * V) {
      const Vec<X, V> g = ldv<X, V>(a.dout + off + c), x = ldv<X, V>(a.inp + off + c), w = ldv<X, V>(a.w + c);
      Vec<X, V> di = ldv<X, V>(a.dinp + off + c);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gk = to_f(g.v[k]);
        const float xhat = (to_f(x.v[k]) - mean) * rstd;
        const float dn = gk * to_f(w.v[k]);
        di.v[k] = from_f<X>(to_f(di.v[k]) + (dn - s_dn - xhat * s_dnx) * rstd);
        sdw[c + k] += gk * xhat;
        sdb[c + k] += gk;
      }
      stv<X, V>(a.dinp + off + c, di);
    }
  }
  __syncthreads();
  float* part = a.scratch + size_t(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float acc = 0.0f;
    for (int w = 0; w < kBwdWarps; ++w) acc += smem[size_t(w) * 2 * C + c];
    part[c] = acc;
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

int bwd_blocks(int N, int C, int num_sms) {
  // two blocks per SM when their shared memory fits (it does up to C = 1792 with 8 warps)
  const size_t smem = size_t(kBwdWarps) * 2 * C * sizeof(float);
  const int per_sm = smem * 2 <= 220 * 1024 ? 2 : 1;
  return int(std::max<long>(1, std::min<long>(long(num_sms) * per_sm, ceil_div(N, kBwdWarps))));
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
  return size_t(bwd_blocks(N, C, num_sms)) * 2 * C * sizeof(float);
}

template <class X>
void layernorm_bwd(const LayerNormBwdArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const bool vec = a.C % V == 0 && is_aligned(a.dinp, 16) && is_aligned(a.dout, 16) && is_aligned(a.inp, 16) &&
                   is_aligned(a.w, 16);
  const int blocks = bwd_blocks(a.N, a.C, a.num_sms);
  const size_t smem = size_t(kBwdWarps) * 2 * a.C * sizeof(float);
  if (vec) {
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_kernel<X, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    layernorm_bwd_kernel<X, V><<<blocks, kBwdWarps * 32, smem, s>>>(a);
  } else {
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_kernel<X, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    layernorm_bwd_kernel<X, 1><<<blocks, kBwdWarps * 32, smem, s>>>(a);
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
