// Fused softmax + cross-entropy over the padded vocabulary, one block per row. Pass one: an online
// (max, sum of exp) per thread over the V real columns, combined across the block. The loss is
// lse - logit[target]. Pass two (dloss != 0): the row is overwritten by
// (softmax - onehot(target)) * dloss, padded columns by 0. Both passes work in base 2 (one FMA and one
// ex2 per logit), take the running maximum once per group of vectors, and check bounds only in the
// last, partial vector.
//
// Two kernels. bf16 rows up to 110 KB (GPT-2's 50304 columns: 98 KB): classifier_row_smem_kernel, one
// bulk asynchronous copy (TMA) of the row into shared memory, both passes there, one bulk copy back, so
// HBM sees one read and one write per logit. Otherwise (fp32, odd widths) classifier_kernel, 256-thread
// blocks reading the row from global memory in both passes; at 8 rows per SM the second read mostly
// misses L2, so HBM sees two reads and a write. Measured on an H200 (N = 65536, Vp = 50304, bf16,
// dloss != 0): 3.2 ms with the first; 4.7-4.9 ms with the second (4.3 TB/s, at the copy bandwidth; the
// same with residency cut to 2-6 rows per SM); 5.6 ms with natural exponentials, a merge per vector and
// a bounds check per logit; 6.2 ms with 1024-thread blocks.
//
// With an FP8 gradient (args.q.out: training.fp8_classifier) both kernels make pass two write the
// gradient as bytes to q.out, one byte per logit with the same vector width, and leave the row alone (the
// shared-memory kernel then has nothing to copy back), so HBM sees a read of bf16 and a write of FP8 per
// logit; each block folds its max |g| into q.amax with one atomic, as the FP8 casts do (fp8_cast.cu).
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "classifier.cuh"

namespace gpt::kern {

namespace {
constexpr int kThreads = 256;
constexpr int kGroup = 4;  // vectors loaded together in pass one
constexpr float kLog2e = 1.4426950408889634f;

// 2^x with the hardware approximation (relative error about 2^-22), as __expf uses
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// v rounded to FP8, nearest even, saturating at the largest finite value (as fp8_cast.cu and base/fp8.hpp)
__device__ __forceinline__ uint8_t quantize(float v, fp8::Format f) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2));
}
// V bytes in one store: p is V-byte aligned (the launcher checks q.out; rows are Vp bytes, Vp % V == 0)
template <int V>
__device__ __forceinline__ void store_bytes(uint8_t* p, const uint8_t (&q)[V]) {
  if constexpr (V == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(q);
  } else if constexpr (V == 4) {
    *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(q);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = q[k];
  }
}
// One gradient value into the thread's running max |g| (a NaN counts as infinity, as in the casts)
__device__ __forceinline__ float fold_abs(float m, float g) { return isnan(g) ? INFINITY : fmaxf(m, fabsf(g)); }
// The block's max |g| folded into *amax (nullable) by thread 0: non-negative floats order as their bit
// patterns. Every thread of the block calls it; sh: 32 floats.
__device__ __forceinline__ void block_amax(float m, float* amax, float* sh) {
  m = warp_max(m);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  if (lane == 0) sh[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0 && amax) {
    for (int w = 1; w < nw; ++w) m = fmaxf(m, sh[w]);
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
  }
}

// (m, s): s = sum of 2^(y - m) over the values y seen, m their maximum (base-2 scaled logits)
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = s * ex2(m - mx) + s2 * ex2(m2 - mx);  // an empty side has s = 0 and m = -FLT_MAX: adds 0
  m = mx;
}

// Folds one vector of scaled logits into (m, s), skipping columns from `V_real` on (padding).
template <class X, int V>
__device__ __forceinline__ void fold_partial_vector(float& m, float& s, const Vec<X, V>& xv, int c, int V_real) {
  float gm = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (c + k < V_real) gm = fmaxf(gm, to_f(xv.v[k]));
  const float mx = fmaxf(m, gm * kLog2e);
  s *= ex2(m - mx);
  m = mx;
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (c + k < V_real) s += ex2(fmaf(to_f(xv.v[k]), kLog2e, -m));
}
// The block's (m, s) combined across each warp, then across warps in a fixed order: the row's
// log-sum-exp in base 2 of the scaled logits, for every thread. sh_m, sh_s: 32 floats each.
__device__ __forceinline__ float block_lse2(float m, float s, float* sh_m, float* sh_s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  if (lane == 0) sh_m[warp] = m, sh_s[warp] = s;
  __syncthreads();
  m = lane < nw ? sh_m[lane] : -FLT_MAX;
  s = lane < nw ? sh_s[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  return m + log2f(s);
}

// Pass two into FP8 bytes, for both kernels below: q = fp8((2^(y - lse2) - [col == target]) * dloss *
// scale) over the row's Vp columns (zeros past V), its max |g| into a.q.amax. x: the row's logits, in
// global or shared memory. Every thread of the block calls it.
template <int Threads, int V, int Unroll, class X, class Args>
__device__ __forceinline__ void quantize_row_gradient(const X* x, int row, int target, float lse2, const Args& a) {
  __shared__ float sh_a[32];
  const float qscale = *a.q.scale, dloss = a.dloss;
  uint8_t* out = a.q.out + size_t(row) * a.Vp;
  float amax = 0.0f;
#pragma unroll Unroll
  for (int c = threadIdx.x * V; c < a.Vp; c += Threads * V) {
    const Vec<X, V> xv = ldv<X, V>(x + c);
    alignas(V) uint8_t q[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p = c + k < a.V ? ex2(fmaf(to_f(xv.v[k]), kLog2e, -lse2)) : 0.0f;
      const float g = (c + k == target ? p - 1.0f : p) * dloss;
      amax = fold_abs(amax, g);
      q[k] = quantize(g * qscale, a.q.fmt);
    }
    store_bytes<V>(out + c, q);
  }
  block_amax(amax, a.q.amax, sh_a);
}

// Q: the gradient goes to a.q.out as FP8 bytes (the logits are only read)
template <class X, int V, bool Q>
__global__ void __launch_bounds__(kThreads) classifier_kernel(ClassifierArgs<X> a) {
  __shared__ float sh_m[32], sh_s[32];
  __shared__ float sh_target;
  const int row = blockIdx.x;
  X* x = a.logits + size_t(row) * a.Vp;
  const int target = a.targets[row];
  if (threadIdx.x == 0) sh_target = to_f(x[target]);  // read before anyone overwrites the row

  // pass one over y = logit * log2(e)
  constexpr int stride = kThreads * V;
  const int whole = a.V / V * V;  // columns in vectors that hold only real columns
  float m = -FLT_MAX, s = 0.0f;
  int c = threadIdx.x * V;
  for (; c + (kGroup - 1) * stride < whole; c += kGroup * stride) {
    Vec<X, V> xv[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) xv[u] = ldv<X, V>(x + c + u * stride);
    float gm = -FLT_MAX;
#pragma unroll
    for (int u = 0; u < kGroup; ++u)
#pragma unroll
      for (int k = 0; k < V; ++k) gm = fmaxf(gm, to_f(xv[u].v[k]));
    const float mx = fmaxf(m, gm * kLog2e);
    s *= ex2(m - mx);
    m = mx;
#pragma unroll
    for (int u = 0; u < kGroup; ++u)
#pragma unroll
      for (int k = 0; k < V; ++k) s += ex2(fmaf(to_f(xv[u].v[k]), kLog2e, -m));
  }
  for (; c < a.V; c += stride)  // the rest, the last vector possibly holding padded columns
    fold_partial_vector<X, V>(m, s, ldv<X, V>(x + c), c, a.V);
  const float lse2 = block_lse2(m, s, sh_m, sh_s);
  if (threadIdx.x == 0) a.losses[row] = lse2 / kLog2e - sh_target;
  const float dloss = a.dloss;
  if constexpr (Q) {  // pass two into FP8 bytes
    quantize_row_gradient<kThreads, V, 4>(x, row, target, lse2, a);
    return;
  }
  if (a.dloss == 0.0f) return;

  // pass two: d = (2^(y - lse2) - [col == target]) * dloss
#pragma unroll 4
  for (c = threadIdx.x * V; c < a.Vp; c += stride) {
    const Vec<X, V> xv = ldv<X, V>(x + c);
    Vec<X, V> g;
    if (c + V <= a.V) {
#pragma unroll
      for (int k = 0; k < V; ++k) g.v[k] = from_f<X>(ex2(fmaf(to_f(xv.v[k]), kLog2e, -lse2)) * dloss);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
        g.v[k] = from_f<X>(c + k < a.V ? ex2(fmaf(to_f(xv.v[k]), kLog2e, -lse2)) * dloss : 0.0f);
    }
    if (unsigned(target - c) < unsigned(V)) {  // the target's vector: once per row
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (c + k == target) g.v[k] = from_f<X>((ex2(fmaf(to_f(xv.v[k]), kLog2e, -lse2)) - 1.0f) * dloss);
    }
    stv<X, V>(x + c, g);
  }
}
// The row-in-shared-memory kernel for bf16 rows that fit (Vp * 2 bytes <= kRowSmemMax, two blocks an
// SM): thread 0 starts one bulk copy of the row into shared memory (completion on an mbarrier), every
// thread waits on it, both passes read shared memory, the gradient overwrites the row in place, and
// thread 0 copies it back in one bulk store, waiting until the store has read shared memory. While one
// block computes, the copy of the SM's other block is in flight; no thread keeps loads in flight.
constexpr int kRowThreads = 512;
constexpr size_t kRowSmemMax = 110 * 1024;  // two rows per SM

// Q: the gradient goes to a.q.out as FP8 bytes, 8 per thread and vector, and the row is not copied back
template <bool Q>
__global__ void __launch_bounds__(kRowThreads) classifier_row_smem_kernel(ClassifierArgs<bf16> a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ float sh_m[32], sh_s[32];
  constexpr int V = 8;
  bf16* row = reinterpret_cast<bf16*>(smem_raw);
  bf16* x = a.logits + size_t(blockIdx.x) * a.Vp;
  const uint32_t bytes = uint32_t(a.Vp) * 2;
  if (threadIdx.x == 0) mbar_init(&bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, bytes);
    bulk_load(row, x, bytes, &bar);
  }
  const int target = a.targets[blockIdx.x];
  mbar_wait(&bar, 0);
  const float target_logit = to_f(row[target]);  // before any thread can overwrite the row in pass two

  // pass one, from shared memory: running (max, sum) in base 2
  constexpr int stride = kRowThreads * V;
  const int whole = a.V / V * V;
  float m = -FLT_MAX, s = 0.0f;
  int c = threadIdx.x * V;
  for (; c + stride < whole; c += 2 * stride) {
    const Vec<bf16, V> x0 = ldv<bf16, V>(row + c), x1 = ldv<bf16, V>(row + c + stride);
    float gm = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < V; ++k) gm = fmaxf(gm, fmaxf(to_f(x0.v[k]), to_f(x1.v[k])));
    const float mx = fmaxf(m, gm * kLog2e);
    s *= ex2(m - mx);
    m = mx;
#pragma unroll
    for (int k = 0; k < V; ++k) s += ex2(fmaf(to_f(x0.v[k]), kLog2e, -m)) + ex2(fmaf(to_f(x1.v[k]), kLog2e, -m));
  }
  for (; c < a.V; c += stride) fold_partial_vector<bf16, V>(m, s, ldv<bf16, V>(row + c), c, a.V);
  const float lse2 = block_lse2(m, s, sh_m, sh_s);
  if (threadIdx.x == 0) a.losses[blockIdx.x] = lse2 / kLog2e - target_logit;
  const float dloss = a.dloss;
  if constexpr (Q) {  // pass two into FP8 bytes, from shared memory; nothing is copied back
    quantize_row_gradient<kRowThreads, V, 1>(row, blockIdx.x, target, lse2, a);
    return;  // every thread waited for the barrier: the row's copy has landed
  }
  if (a.dloss == 0.0f) return;  // nothing was written: no copy back (the barrier's copy has landed)

  // pass two: the gradient over the row in place, then one bulk copy back
  for (c = threadIdx.x * V; c < a.Vp; c += stride) {
    const Vec<bf16, V> xv = ldv<bf16, V>(row + c);
    Vec<bf16, V> g;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p = c + k < a.V ? ex2(fmaf(to_f(xv.v[k]), kLog2e, -lse2)) : 0.0f;
      g.v[k] = from_f<bf16>((c + k == target ? p - 1.0f : p) * dloss);
    }
    stv<bf16, V>(row + c, g);
  }
  fence_proxy_async_smem();  // the threads' writes -> the bulk copy
  __syncthreads();
  if (threadIdx.x == 0) bulk_store_wait_read(x, row, bytes);  // shared memory stays until read
}
}  // namespace

template <class X>
void classifier(const ClassifierArgs<X>& a, cudaStream_t s) {
  if (a.N == 0) return;
  constexpr int V = kVec16<X>;
  const bool q = a.q.out != nullptr;
  if (q && !a.q.scale) throw KernelError(KernelError::Kind::kUnsupported, "classifier: an FP8 gradient needs its scale");
  // vectors: rows of whole 16-byte vectors of logits, and of V-byte vectors of the FP8 gradient
  const bool vec = a.Vp % V == 0 && is_aligned(a.logits, 16) && (!q || is_aligned(a.q.out, V));
  if constexpr (std::is_same_v<X, bf16>) {
    const size_t row_bytes = size_t(a.Vp) * sizeof(X);
    if (vec && row_bytes <= kRowSmemMax) {  // rows 16-byte aligned, two fit in an SM's shared memory
      auto kernel = q ? classifier_row_smem_kernel<true> : classifier_row_smem_kernel<false>;
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(row_bytes)));
      kernel<<<a.N, kRowThreads, row_bytes, s>>>(a);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (q && vec)
    classifier_kernel<X, V, true><<<a.N, kThreads, 0, s>>>(a);
  else if (q)
    classifier_kernel<X, 1, true><<<a.N, kThreads, 0, s>>>(a);
  else if (vec)
    classifier_kernel<X, V, false><<<a.N, kThreads, 0, s>>>(a);
  else
    classifier_kernel<X, 1, false><<<a.N, kThreads, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}
template void classifier<float>(const ClassifierArgs<float>&, cudaStream_t);
template void classifier<bf16>(const ClassifierArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
