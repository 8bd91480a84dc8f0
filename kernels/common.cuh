// Device helpers shared by the kernels: dtype conversion, 16-byte vectors, warp/block reductions,
// stochastic rounding. Header-only; every kernel file includes it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace gpt::kern {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

template <class X>
struct Cvt;
template <>
struct Cvt<float> {
  __device__ __forceinline__ static float from(float x) { return x; }
};
template <>
struct Cvt<bf16> {
  __device__ __forceinline__ static bf16 from(float x) { return __float2bfloat16_rn(x); }
};
template <class X>
__device__ __forceinline__ X from_f(float x) {
  return Cvt<X>::from(x);
}

// V elements of X in one aligned access: V = 16 / sizeof(X) gives a 16-byte load/store.
template <class X, int V>
struct alignas(sizeof(X) * V) Vec {
  X v[V];
};
template <class X>
constexpr int kVec16 = int(16 / sizeof(X));

template <class X, int V>
__device__ __forceinline__ Vec<X, V> ldv(const X* p) {
  return *reinterpret_cast<const Vec<X, V>*>(p);
}
template <class X, int V>
__device__ __forceinline__ void stv(X* p, const Vec<X, V>& x) {
  *reinterpret_cast<Vec<X, V>*>(p) = x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats; the reduction order is fixed, so results are deterministic.
__device__ __forceinline__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < nw ? shared[lane] : 0.0f;
  return warp_sum(x);
}

// dst (cols) += the sum of S partial rows part (S, cols; rows ld floats apart), fp32: 32 columns per
// block (blockDim 32 x 32), 32 rows of threads striding over the partial rows (loads unrolled, so several
// are in flight), combined in a fixed order (deterministic). Columns from `split` on go to dst2[c - split]
// instead (a reduction feeding two outputs, e.g. LayerNorm's dw and db). ACC false: dst = the sum
// (overwritten). Launch: partial_rows_grid(cols), dim3(32, 32).
template <class X, bool ACC = true>
__global__ void __launch_bounds__(1024) add_partial_rows_kernel(X* __restrict__ dst, X* __restrict__ dst2,
                                                                int split, const float* __restrict__ part,
                                                                int S, int cols, int ld) {
  __shared__ float sh[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
#pragma unroll 8
    for (int r = threadIdx.y; r < S; r += 32) acc += part[size_t(r) * ld + c];
  }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float sum = 0.0f;
  for (int y = 0; y < 32; ++y) sum += sh[y][threadIdx.x];
  X* d = c < split ? dst + c : dst2 + (c - split);
  *d = from_f<X>(ACC ? to_f(*d) + sum : sum);
}

// ---- Bulk asynchronous copies between global and shared memory (the Hopper TMA unit, sm_90), each
// load completing on an mbarrier. Addresses 16-byte aligned, sizes multiples of 16 bytes.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// one thread, before the barrier is used (then __syncthreads): `count` arrivals complete a phase
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// one arrival that also expects `bytes` of copies to land before the phase completes
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// waits until the phase with this parity (0 for the first phase, then alternating) has completed
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  for (uint32_t done = 0; !done;)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
}
// global -> shared, `bytes` counted on bar's transaction count
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// shared -> global; returns once the copy has read shared memory (which may then be reused). Writes of
// the block's threads to src must be made visible first: fence.proxy.async, then __syncthreads.
__device__ __forceinline__ void bulk_store_wait_read(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// splitmix64 finaliser: a counter-based random number per (seed, index).
__device__ __forceinline__ uint32_t hash_u32(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return uint32_t(x);
}
// Stochastic rounding to bf16: add 16 random bits below the kept mantissa, then truncate. The bits are
// sign-magnitude, so the magnitude rounds up with probability equal to the dropped fraction.
__device__ __forceinline__ bf16 sr_bf16(float x, uint32_t rnd) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf / nan unchanged
  bits = (bits + (rnd & 0xffffu)) & 0xffff0000u;
  return __ushort_as_bfloat16(uint16_t(bits >> 16));
}

}  // namespace gpt::kern

namespace gpt {
// Host-side helpers for launchers.
inline bool is_aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }
inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
inline unsigned partial_rows_grid(int cols) { return unsigned(ceil_div(cols, 32)); }
}  // namespace gpt
