// Rotary position embedding, in place on q and k: one thread per (b, t, pair i), which computes the pair's
// angle once and rotates it in every head of q and of k. A warp's threads are consecutive pairs of one
// position, so each head's two halves are read and written as contiguous runs.
#include "rope.cuh"

#include "base/rope.hpp"

namespace gpt::kern {

namespace {
constexpr int kThreads = 256;

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
}  // namespace

template <class X>
void rope(const RopeArgs<X>& a, cudaStream_t s) {
  const long work = long(a.B) * a.T * (a.HS / 2);
  rope_kernel<X><<<unsigned(ceil_div(work, kThreads)), kThreads, 0, s>>>(a.qkv, a.B * a.T, a.T, a.NH, a.HS, a.inverse);
  CUDA_CHECK_LAUNCH();
}

template void rope<float>(const RopeArgs<float>&, cudaStream_t);
template void rope<bf16>(const RopeArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
