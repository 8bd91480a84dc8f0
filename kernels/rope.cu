// Rotary position embedding, in place on q and k. The fast path: one thread per (b, t, V consecutive pairs,
// a chunk of kHeadsPerThread heads), which computes its V angles once and rotates them in each head of its
// chunk with 16-byte loads and stores of both halves, kBatch heads' loads in flight at a time. Heads whose
// half is not a multiple of V take the plain path: one thread per (b, t, pair) walking every head. Both
// compute each angle and rotation with the same functions (base/rope.hpp), so they give the same bits.
#include "rope.cuh"

#include "base/rope.hpp"

namespace gpt::kern {

namespace {
constexpr int kThreads = 256;
constexpr int kHeadsPerThread = 8;  // the angles' cost shared by this many heads; more threads than heads
constexpr int kBatch = 4;           // heads loaded before any is rotated and stored

template <class X>
__global__ void rope_kernel(X* __restrict__ qkv, int BT, int T, int NH, int HS, bool inverse) {
  const int half = HS / 2;
  const long idx = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (idx >= long(BT) * half) return;
  const int bt = int(idx / half), i = int(idx % half);
  const RopeAngle r = rope_angle(bt % T, i, HS, inverse);
  X* row = qkv + size_t(bt) * 3 * NH * HS;  // q's NH heads, then k's
  for (int h = 0; h < 2 * NH; ++h) {
    X* v = row + size_t(h) * HS;
    float x = to_f(v[i]), y = to_f(v[i + half]);
    rope_rotate(x, y, r);
    v[i] = from_f<X>(x);
    v[i + half] = from_f<X>(y);
  }
}

// thread index = (bt, head chunk, pair group), the pair group fastest: a warp's loads are whole runs of a
// head's halves
template <class X, int V>
__global__ void rope_vec_kernel(X* __restrict__ qkv, int BT, int T, int NH, int HS, bool inverse) {
  const int half = HS / 2, groups = half / V, chunks = (2 * NH + kHeadsPerThread - 1) / kHeadsPerThread;
  const long idx = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (idx >= long(BT) * chunks * groups) return;
  const int g = int(idx % groups), chunk = int(idx / groups % chunks), bt = int(idx / (long(groups) * chunks));
  const int i0 = g * V, h0 = chunk * kHeadsPerThread, h1 = min(h0 + kHeadsPerThread, 2 * NH);
  RopeAngle r[V];
#pragma unroll
  for (int j = 0; j < V; ++j) r[j] = rope_angle(bt % T, i0 + j, HS, inverse);
  X* row = qkv + size_t(bt) * 3 * NH * HS + i0;  // q's NH heads, then k's
  for (int h = h0; h < h1; h += kBatch) {
    Vec<X, V> a[kBatch], b[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (h + u < h1) {
        a[u] = ldv<X, V>(row + size_t(h + u) * HS);
        b[u] = ldv<X, V>(row + size_t(h + u) * HS + half);
      }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (h + u < h1) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          float x = to_f(a[u].v[j]), y = to_f(b[u].v[j]);
          rope_rotate(x, y, r[j]);
          a[u].v[j] = from_f<X>(x);
          b[u].v[j] = from_f<X>(y);
        }
        stv<X, V>(row + size_t(h + u) * HS, a[u]);
        stv<X, V>(row + size_t(h + u) * HS + half, b[u]);
      }
  }
}
}  // namespace

template <class X>
void rope(const RopeArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const int half = a.HS / 2;
  if (half % V == 0 && is_aligned(a.qkv, 16)) {
    const long chunks = ceil_div(2L * a.NH, kHeadsPerThread);
    const long work = long(a.B) * a.T * chunks * (half / V);
    rope_vec_kernel<X, V><<<unsigned(ceil_div(work, kThreads)), kThreads, 0, s>>>(a.qkv, a.B * a.T, a.T, a.NH, a.HS,
                                                                                 a.inverse);
  } else {
    const long work = long(a.B) * a.T * half;
    rope_kernel<X><<<unsigned(ceil_div(work, kThreads)), kThreads, 0, s>>>(a.qkv, a.B * a.T, a.T, a.NH, a.HS,
                                                                         a.inverse);
  }
  CUDA_CHECK_LAUNCH();
}

template void rope<float>(const RopeArgs<float>&, cudaStream_t);
template void rope<bf16>(const RopeArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
