// Device helpers shared by the kernels: dtype conversion, 16-byte vectors, warp/block reductions,
// stochastic rounding, and the one launcher of elementwise kernels. Header-only; every kernel file
// includes it. The launchers (one header per op, kernels/*.cuh) each take the stream they queue on; none
// allocates or synchronises with the host unless its header says so.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "base/random.hpp"  // splitmix64
#include "check.cuh"

namespace gpt {
// Host-side helpers for launchers.
inline bool is_aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }
inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
inline unsigned partial_rows_grid(int cols) { return unsigned(ceil_div(cols, 32)); }
}  // namespace gpt

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

// a counter-based random number per (seed, index): splitmix64's low 32 bits
__device__ __forceinline__ uint32_t hash_u32(uint64_t x) { return uint32_t(splitmix64(x)); }
// Stochastic rounding to bf16: add 16 random bits below the kept mantissa, then truncate. The bits are
// sign-magnitude, so the magnitude rounds up with probability equal to the dropped fraction.
__device__ __forceinline__ bf16 sr_bf16(float x, uint32_t rnd) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf / nan unchanged
  bits = (bits + (rnd & 0xffffu)) & 0xffff0000u;
  return __ushort_as_bfloat16(uint16_t(bits >> 16));
}

// ---- Elementwise kernels: one launcher for every op whose elements are independent of each other
// (conversions, add, GELU, AdamW). By default one thread per index (or per vector of V elements), as
// many blocks as that takes, so the grid depends on n alone; a grid-stride loop covers counts beyond the
// grid's limit. Measured on an H200 for AdamW over 1558M parameters in 50 buckets: 11.1 ms, against
// 12.6 ms for a grid-stride loop over the blocks resident at once and 12.2 ms over 8 blocks per SM
// (short blocks keep every SM loading to the end); over 201M bf16 elements, the conversions and the add
// 5-7% faster than a grid-stride loop over 16 blocks an SM. An op may instead cap the grid at
// blocks_per_sm blocks per multiprocessor (the activations, GELU's tanh making each element dearer: activation.cu).
constexpr int kElementwiseThreads = 256;

// The current device's multiprocessor count, queried once per device and kept.
inline int sm_count() {
  static std::mutex mu;
  static std::vector<int> counts;  // by device ordinal; 0: not asked yet
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(dev) >= counts.size()) counts.resize(size_t(dev) + 1, 0);
  if (counts[dev] == 0) CUDA_CHECK(cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev));
  return counts[dev];
}
// blocks_per_sm = 0: no cap
inline unsigned elementwise_grid(size_t n, int blocks_per_sm = 0) {
  long blocks = std::min<long>(ceil_div(long(n), kElementwiseThreads), 1L << 30);
  if (blocks_per_sm > 0) blocks = std::min<long>(blocks, long(blocks_per_sm) * sm_count());
  return unsigned(std::max<long>(1, blocks));
}

// op(i) for every i < n. Op: trivially copyable, with `__device__ void operator()(size_t i) const`.
template <class Op>
__global__ void elementwise_kernel(Op op, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) op(i);
}
template <class Op>
void launch_elementwise(size_t n, const Op& op, cudaStream_t s) {
  if (n == 0) return;
  elementwise_kernel<<<elementwise_grid(n), kElementwiseThreads, 0, s>>>(op, n);
  CUDA_CHECK_LAUNCH();
}

// The vectorised form: `op.template apply<W>(e)` handles the W elements from e on (W = V or 1). With
// `aligned` (the caller's pointers suit V-element accesses), the n / V whole vectors go in one launch of
// V-element accesses and the rest, fewer than V elements, in a scalar one; otherwise every element
// takes the scalar path. Each element sees the same arithmetic either way.
template <int W, class Op>
__global__ void elementwise_vec_kernel(Op op, size_t first, size_t nv) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nv; i += size_t(gridDim.x) * blockDim.x)
    op.template apply<W>(first + i * W);
}
template <int V, class Op>
void launch_elementwise_vec(size_t n, bool aligned, const Op& op, cudaStream_t s, int blocks_per_sm = 0) {
  if (n == 0) return;
  const size_t bulk = aligned ? n / V * V : 0;
  const unsigned threads = kElementwiseThreads;
  if (bulk) elementwise_vec_kernel<V><<<elementwise_grid(bulk / V, blocks_per_sm), threads, 0, s>>>(op, 0, bulk / V);
  if (n > bulk)
    elementwise_vec_kernel<1><<<elementwise_grid(n - bulk, blocks_per_sm), threads, 0, s>>>(op, bulk, n - bulk);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::kern
