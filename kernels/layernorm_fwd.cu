// LayerNorm forward (eps 1e-5): one warp per row, three passes over the row (mean, centred variance,
// normalise; RMSNorm: the mean is 0 and there is no bias, two passes); the second and third hit L1 or, for rows of up to 2048 bf16 or 1024 fp32 columns (every
// GPT-2 width in bf16), read the row from registers (layernorm_fwd_kernel's K). The residual variant
// computes residual = a + b in pass one, rounds it to X, stores it and normalises the stored value (what
// the backward pass sees).
#include <cuda_fp8.h>

#include "layernorm.cuh"

namespace gpt::kern {

namespace {
constexpr float kEps = 1e-5f;
constexpr int kFwdWarps = 8;

// The forward's per-vector arithmetic, shared by both of its variants: the residual a + b rounded to X, the
// vector's share of the row's sum and of its centred sum of squares, and the normalised output.
template <class X, int V>
__device__ __forceinline__ Vec<X, V> fwd_residual(const Vec<X, V>& av, const Vec<X, V>& bv) {
  Vec<X, V> x;
#pragma unroll
  for (int j = 0; j < V; ++j) x.v[j] = from_f<X>(to_f(av.v[j]) + to_f(bv.v[j]));
  return x;
}
template <class X, int V>
__device__ __forceinline__ void fwd_sum(const Vec<X, V>& x, float& sum) {
#pragma unroll
  for (int j = 0; j < V; ++j) sum += to_f(x.v[j]);
}
template <class X, int V>
__device__ __forceinline__ void fwd_var(const Vec<X, V>& x, float mean, float& var) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float d = to_f(x.v[j]) - mean;
    var += d * d;
  }
}
// A LayerNorm without a bias (model.bias false) adds -0: y + -0 is y for every y, -0 included.
template <class X, int V>
__device__ __forceinline__ Vec<X, V> negative_zeros() {
  Vec<X, V> z;
#pragma unroll
  for (int j = 0; j < V; ++j) z.v[j] = from_f<X>(-0.0f);
  return z;
}
// y: LayerNorm's (x - mean) * rstd * w + b, or RMSNorm's x * rstd * w (no bias: adding a zero would turn
// the -0 of a zero input under a negative weight into +0, which the CPU reference keeps)
template <bool RMS>
__device__ __forceinline__ float fwd_y(float x, float mean, float rstd, float w, float b) {
  if constexpr (RMS) return x * rstd * w;
  else return (x - mean) * rstd * w + b;
}
template <class X, int V, bool RMS>
__device__ __forceinline__ Vec<X, V> fwd_normalise(const Vec<X, V>& x, float mean, float rstd, const Vec<X, V>& wv,
                                                  const Vec<X, V>& bv) {
  Vec<X, V> o;
#pragma unroll
  for (int j = 0; j < V; ++j) o.v[j] = from_f<X>(fwd_y<RMS>(to_f(x.v[j]), mean, rstd, to_f(wv.v[j]), to_f(bv.v[j])));
  return o;
}

// The normalised vector quantized to FP8 (precision fp8): written as V bytes, its max |y| kept in m.
template <class X, int V, bool RMS>
__device__ __forceinline__ void fwd_store_fp8(const LayerNormFwdArgs<X>& a, size_t at, const Vec<X, V>& x, float mean,
                                              float rstd, const Vec<X, V>& wv, const Vec<X, V>& bv, float s, float& m) {
  Vec<uint8_t, V> q;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float y = fwd_y<RMS>(to_f(x.v[j]), mean, rstd, to_f(wv.v[j]), to_f(bv.v[j]));
    m = isnan(y) ? INFINITY : fmaxf(m, fabsf(y));
    q.v[j] = uint8_t(__nv_cvt_float_to_fp8(y * s, __NV_SATFINITE,
                                           a.fp8_fmt == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2));
  }
  stv<uint8_t, V>(a.out_fp8 + at, q);
}

// One warp per row, three passes over it (mean, centred variance, normalise). K = 0: each pass walks
// the row in memory (the second and third hit L1). K >= 1, for rows of at most 32 K vectors: the row is
// held in registers, K vectors a lane, so every load of it is issued before the first sum and the second
// and third passes read no memory (at GPT-2 1558M's width, 7 vectors a lane, the loop keeps too few of a
// row's loads in flight). The same per-vector arithmetic in the same order either way: the same bits.
// Q: the output is FP8 bytes (out_fp8) and the row's amax goes into *fp8_amax, one atomic per warp.
// RMS: RMSNorm: no first pass (the mean is 0: the "centred" variance is the mean square) and a zero bias.
template <class X, int V, int K, bool RESID, bool Q, bool RMS>
__global__ void __launch_bounds__(kFwdWarps * 32) layernorm_fwd_kernel(LayerNormFwdArgs<X> a) {
  auto bias = [&](int c) {  // RMSNorm has none (fwd_y does not read it)
    if constexpr (RMS) return Vec<X, V>{};
    else return a.bias ? ldv<X, V>(a.bias + c) : negative_zeros<X, V>();
  };
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kFwdWarps + threadIdx.x / 32;
  if (row >= a.N) return;
  const int C = a.C;
  const size_t off = size_t(row) * C;
  float sum = 0.0f, var = 0.0f, mean, rstd, qmax = 0.0f;
  const float qs = Q ? *a.fp8_scale : 0.0f;
  if constexpr (K == 0) {
    // in residual mode x is this lane's own earlier stores: plain loads, never the read-only path
    const X* x = RESID ? a.residual + off : a.inp + off;
    for (int c = lane * V; c < C; c += 32 * V) {
      Vec<X, V> xv;
      if constexpr (RESID) {
        xv = fwd_residual<X, V>(ldv<X, V>(a.a + off + c), ldv<X, V>(a.b + off + c));
        stv<X, V>(a.residual + off + c, xv);
      } else {
        xv = ldv<X, V>(x + c);
      }
      if constexpr (!RMS) fwd_sum<X, V>(xv, sum);
    }
    mean = RMS ? 0.0f : warp_sum(sum) / C;
    for (int c = lane * V; c < C; c += 32 * V) fwd_var<X, V>(ldv<X, V>(x + c), mean, var);
    rstd = rsqrtf(warp_sum(var) / C + kEps);
    for (int c = lane * V; c < C; c += 32 * V) {
      if constexpr (Q)
        fwd_store_fp8<X, V, RMS>(a, off + c, ldv<X, V>(x + c), mean, rstd, ldv<X, V>(a.w + c), bias(c), qs, qmax);
      else
        stv<X, V>(a.out + off + c,
                  fwd_normalise<X, V, RMS>(ldv<X, V>(x + c), mean, rstd, ldv<X, V>(a.w + c), bias(c)));
    }
  } else {
    auto col = [&](int k) { return (lane + 32 * k) * V; };  // the first column of this lane's vector k
    Vec<X, V> xv[K];
    if constexpr (RESID) {
      Vec<X, V> av[K], bv[K];
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < C) av[k] = ldv<X, V>(a.a + off + col(k)), bv[k] = ldv<X, V>(a.b + off + col(k));
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < C) {
          xv[k] = fwd_residual<X, V>(av[k], bv[k]);
          stv<X, V>(a.residual + off + col(k), xv[k]);
        }
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < C) xv[k] = ldv<X, V>(a.inp + off + col(k));
    }
    if constexpr (!RMS) {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < C) fwd_sum<X, V>(xv[k], sum);
    }
    mean = RMS ? 0.0f : warp_sum(sum) / C;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < C) fwd_var<X, V>(xv[k], mean, var);
    rstd = rsqrtf(warp_sum(var) / C + kEps);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (col(k) < C) {
        if constexpr (Q)
          fwd_store_fp8<X, V, RMS>(a, off + col(k), xv[k], mean, rstd, ldv<X, V>(a.w + col(k)), bias(col(k)), qs, qmax);
        else
          stv<X, V>(a.out + off + col(k),
                    fwd_normalise<X, V, RMS>(xv[k], mean, rstd, ldv<X, V>(a.w + col(k)), bias(col(k))));
      }
  }
  if constexpr (Q) {
    qmax = warp_max(qmax);
    if (lane == 0 && a.fp8_amax) atomicMax(reinterpret_cast<int*>(a.fp8_amax), __float_as_int(qmax));
  }
  if (lane == 0) {
    if (a.mean && !RMS) a.mean[row] = mean;
    if (a.rstd) a.rstd[row] = rstd;
  }
}

constexpr int kFwdMaxVecsPerLane = 8;  // rows held in registers: K = 1..8
template <class X, int V, int K, bool RMS>
void launch_fwd_kind(const LayerNormFwdArgs<X>& a, bool resid, cudaStream_t s) {
  const unsigned grid = unsigned(ceil_div(a.N, kFwdWarps)), block = kFwdWarps * 32;
  const bool q = a.out_fp8 != nullptr;
  if (resid && q)
    layernorm_fwd_kernel<X, V, K, true, true, RMS><<<grid, block, 0, s>>>(a);
  else if (resid)
    layernorm_fwd_kernel<X, V, K, true, false, RMS><<<grid, block, 0, s>>>(a);
  else if (q)
    layernorm_fwd_kernel<X, V, K, false, true, RMS><<<grid, block, 0, s>>>(a);
  else
    layernorm_fwd_kernel<X, V, K, false, false, RMS><<<grid, block, 0, s>>>(a);
}
template <class X, int V, int K>
void launch_fwd(const LayerNormFwdArgs<X>& a, bool resid, cudaStream_t s) {
  if (a.rms)
    launch_fwd_kind<X, V, K, true>(a, resid, s);
  else
    launch_fwd_kind<X, V, K, false>(a, resid, s);
}
}  // namespace

template <class X>
void layernorm_fwd(const LayerNormFwdArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const bool resid = a.residual != nullptr;
  bool vec = a.C % V == 0 && is_aligned(a.out_fp8 ? (const void*)a.out_fp8 : a.out, a.out_fp8 ? 8 : 16) &&
             is_aligned(a.w, 16) && (a.rms || !a.bias || is_aligned(a.bias, 16));
  if (resid)
    vec = vec && is_aligned(a.residual, 16) && is_aligned(a.a, 16) && is_aligned(a.b, 16);
  else
    vec = vec && is_aligned(a.inp, 16);
  // rows of 16-byte vectors, up to 32 x 8 of them: in registers (per_lane vectors a lane); else the loop
  const int per_lane = vec ? int(ceil_div(a.C / V, 32)) : 0;
  switch (per_lane > kFwdMaxVecsPerLane ? 0 : per_lane) {
    case 1: launch_fwd<X, V, 1>(a, resid, s); break;
    case 2: launch_fwd<X, V, 2>(a, resid, s); break;
    case 3: launch_fwd<X, V, 3>(a, resid, s); break;
    case 4: launch_fwd<X, V, 4>(a, resid, s); break;
    case 5: launch_fwd<X, V, 5>(a, resid, s); break;
    case 6: launch_fwd<X, V, 6>(a, resid, s); break;
    case 7: launch_fwd<X, V, 7>(a, resid, s); break;
    case 8: launch_fwd<X, V, 8>(a, resid, s); break;
    default:
      if (vec)
        launch_fwd<X, V, 0>(a, resid, s);
      else
        launch_fwd<X, 1, 0>(a, resid, s);
  }
  CUDA_CHECK_LAUNCH();
}

template void layernorm_fwd<float>(const LayerNormFwdArgs<float>&, cudaStream_t);
template void layernorm_fwd<bf16>(const LayerNormFwdArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
