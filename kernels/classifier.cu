// Fused softmax + cross-entropy over the padded vocabulary, one block per row. Pass one: an online
// (max, sum of exp) per thread over the V real columns, combined across the block. The loss is
// lse - logit[target]. Pass two (dloss != 0): the row, now warm in L2, is overwritten by
// (softmax - onehot(target)) * dloss, padded columns by 0.
// Blocks of 256 threads, so eight rows are in flight per SM and one row's reduction overlaps other rows'
// loads and stores. With the row read from HBM once and written once, the kernel is bound by its
// instruction issue and its exponentials more than by memory (3.3 G logits a step at GPT-2 124M, B=64),
// so it works in base 2 (one FMA and one ex2 per logit and pass), takes the running maximum once per
// four vectors rather than per vector, and checks bounds only in the last, partial vector.
// Measured on an H200 (N = 65536, Vp = 50304, bf16): 4.7 ms, against 5.6 ms for the same blocks with
// natural exponentials, a merge per vector and a bounds check per logit; 6.2 ms with 1024-thread
// blocks (two per SM). A
// variant holding the row in registers (one read, one write; 1024 threads, one block per SM) ran 7.6 ms:
// with a single block per SM the load, reduce and store phases no longer overlap.
#include <cfloat>

#include "cuda/cuda_check.cuh"
#include "ops.cuh"

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
// (m, s): s = sum of 2^(y - m) over the values y seen, m their maximum (base-2 scaled logits)
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = s * ex2(m - mx) + s2 * ex2(m2 - mx);  // an empty side has s = 0 and m = -FLT_MAX: adds 0
  m = mx;
}

template <class X, int V>
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
  for (; c < a.V; c += stride) {  // the rest, the last vector possibly holding padded columns
    const Vec<X, V> xv = ldv<X, V>(x + c);
    float gm = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (c + k < a.V) gm = fmaxf(gm, to_f(xv.v[k]));
    const float mx = fmaxf(m, gm * kLog2e);
    s *= ex2(m - mx);
    m = mx;
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (c + k < a.V) s += ex2(fmaf(to_f(xv.v[k]), kLog2e, -m));
  }
  // combine across the warp, then across warps (fixed order)
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  if (lane == 0) {
    sh_m[warp] = m;
    sh_s[warp] = s;
  }
  __syncthreads();
  m = lane < nw ? sh_m[lane] : -FLT_MAX;
  s = lane < nw ? sh_s[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  const float lse2 = m + log2f(s);  // log-sum-exp in base 2 of the scaled logits
  if (threadIdx.x == 0) a.losses[row] = lse2 / kLog2e - sh_target;
  if (a.dloss == 0.0f) return;

  // pass two: d = (2^(y - lse2) - [col == target]) * dloss
  const float dloss = a.dloss;
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
}  // namespace

template <class X>
void classifier(const ClassifierArgs<X>& a, cudaStream_t s) {
  if (a.N == 0) return;
  constexpr int V = kVec16<X>;
  const bool vec = a.Vp % V == 0 && is_aligned(a.logits, 16);
  if (vec)
    classifier_kernel<X, V><<<a.N, kThreads, 0, s>>>(a);
  else
    classifier_kernel<X, 1><<<a.N, kThreads, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}
template void classifier<float>(const ClassifierArgs<float>&, cudaStream_t);
template void classifier<bf16>(const ClassifierArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
