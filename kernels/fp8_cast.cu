// FP8 casts. One block per 128 x 64 tile: each thread loads one 16-byte vector (8 bf16) of four rows 32
// apart (every load issued before any arithmetic; with two inputs, into shared memory), turns them into v,
// writes the row-major bytes straight away and keeps them in shared memory, from where the transposed
// bytes go out 16 at a time (each of the tile's 64 columns becomes 128 contiguous bytes, a whole cache
// line, of a row of the transpose). Column sums: each thread's four rows, then the four lanes of a warp
// that hold the same columns (shuffles), then the eight warps in shared memory, all in a fixed order; then
// one reduction over the row tiles (add_partial_rows_kernel): deterministic. The amax is one atomic per
// block.
#include <cuda_fp8.h>

#include "fp8_cast.cuh"

#include "base/activation.hpp"

namespace gpt::kern {

namespace {
// 128 x 64 tiles, 256 threads: 8 threads of 8 columns per row, 32 rows per pass, four passes. Shared rows
// are 65 bytes apart, so the transposed read (16 rows of one column per thread) spreads over the banks.
constexpr int kTileR = 128, kTileC = 64, kThreads = 256, kPasses = kTileR / 32, kPad = 1;
constexpr int kWarps = kThreads / 32;
__device__ __forceinline__ bool is_aligned_dev(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

__device__ __forceinline__ uint16_t quantize2(float a, float b, fp8::Format f) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, f == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
}
// GELU and its derivative through the logistic function (base/gelu_logistic.hpp), as the CPU emulation
// computes them: one exponential and one reciprocal on the multi-function unit (the exact tanhf made the
// derivative's cast issue-bound on an H200: 83% of issue slots, 2.7 TB/s for GPT-2 1558M's fc gradient).
// |v| as bits, NaN above infinity: non-negative floats order as their bit patterns, so a running
// integer max is the amax (abs_bits_to_amax turns a NaN into infinity)
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }
__device__ __forceinline__ float abs_bits_to_amax(unsigned m) {
  return m > 0x7f800000u ? INFINITY : __uint_as_float(m);
}
// max |v| over the block (a NaN counts as infinity), folded into *amax: non-negative floats order as
// their bit patterns
__device__ __forceinline__ void block_amax(float m, float* amax) {
  __shared__ float sh[kWarps];
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0 && amax) {
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, sh[w]);
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
  }
}
// The tile's bytes in shared memory (kTileR rows) -> out_t (C, N): thread t writes column t / 4 of the
// tile, rows (t % 4) * 16 .. + 16 of each 64-row half
__device__ __forceinline__ void write_transposed(uint8_t (*qs)[kTileC + kPad], uint8_t* out_t, int r0, int c0, int N,
                                                 int C) {
  const int cc = threadIdx.x / 4;
  if (c0 + cc >= C) return;
#pragma unroll
  for (int half = 0; half < kTileR / 64; ++half) {
    const int rr = half * 64 + (threadIdx.x % 4) * 16;
    if (r0 + rr >= N) continue;
    uint8_t q[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) q[k] = qs[rr + k][cc];
    uint8_t* dst = out_t + size_t(c0 + cc) * N + r0 + rr;
    if (r0 + rr + 16 <= N && is_aligned_dev(dst, 16)) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(q);
    } else {
      for (int k = 0; k < 16 && r0 + rr + k < N; ++k) dst[k] = q[k];
    }
  }
}
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.commit_group;" ::: "memory");
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// ACT: what v is (Fp8CastArgs::act)
template <class X, Fp8CastAct ACT, bool SUMS>
__global__ void __launch_bounds__(kThreads) fp8_cast_kernel(Fp8CastArgs<X> a) {
  // Two inputs (GELU's derivative) come into shared memory by cp.async rather than into registers: the
  // registers that held them allowed 2 blocks an SM (95 a thread), shared memory allows 4 (an H200: the
  // cast 23% faster at GPT-2 124M's and 1558M's fc shapes). One input stays in registers (faster so).
  constexpr bool kStaged = ACT == Fp8CastAct::kGeluGrad || ACT == Fp8CastAct::kRelu2Grad;
  __shared__ uint8_t qs[kTileR][kTileC + kPad];
  __shared__ float part[SUMS ? kWarps : 1][SUMS ? kTileC : 1];
  __shared__ __align__(16) X staged[kStaged ? 2 : 1][kStaged ? kTileR : 1][kStaged ? kTileC : 8];
  const int r0 = blockIdx.y * kTileR, c0 = blockIdx.x * kTileC;
  const int tc = (threadIdx.x % 8) * 8, c = c0 + tc;
  const float s = *a.scale;
  unsigned m = 0;
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  // every load of the thread's rows first, then the arithmetic (kPasses rows 32 apart); each thread reads
  // back only the vectors it copied itself
  Vec<X, 8> xv[kStaged ? 1 : kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int tr = threadIdx.x / 8 + 32 * p, r = r0 + tr;
    if (r < a.N && c < a.C) {
      if constexpr (kStaged) {
        copy16_async(&staged[0][tr][tc], a.x + size_t(r) * a.C + c);
        copy16_async(&staged[1][tr][tc], a.act_in + size_t(r) * a.C + c);
      } else {
        xv[p] = ldv<X, 8>(a.x + size_t(r) * a.C + c);
      }
    }
  }
  if constexpr (kStaged) copies_wait();
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int tr = threadIdx.x / 8 + 32 * p, r = r0 + tr;
    const bool in = r < a.N && c < a.C;
    Vec<X, 8> x, g;
    if constexpr (kStaged) {
      x = ldv<X, 8>(&staged[0][tr][tc]);
      g = ldv<X, 8>(&staged[1][tr][tc]);
    } else {
      x = xv[p];
    }
    uint32_t q[2];  // the 8 bytes, converted two at a time
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * h + j;
        v[j] = 0.0f;
        if (in) {
          v[j] = to_f(x.v[k]);
          if constexpr (ACT == Fp8CastAct::kGelu) v[j] = gelu_logistic(v[j]);
          if constexpr (ACT == Fp8CastAct::kGeluGrad) v[j] *= gelu_logistic_grad(to_f(g.v[k]));
          if constexpr (ACT == Fp8CastAct::kRelu2) v[j] = relu2(v[j]);
          if constexpr (ACT == Fp8CastAct::kRelu2Grad) v[j] *= relu2_grad(to_f(g.v[k]));
        }
        m = max(m, abs_bits(v[j]));
        if constexpr (SUMS) sum[k] += v[j];
      }
      q[h] = uint32_t(quantize2(v[0] * s, v[1] * s, a.fmt)) | uint32_t(quantize2(v[2] * s, v[3] * s, a.fmt)) << 16;
    }
    const uint8_t* qb = reinterpret_cast<const uint8_t*>(q);
#pragma unroll
    for (int k = 0; k < 8; ++k) qs[tr][tc + k] = qb[k];
    if (in && a.out) *reinterpret_cast<uint2*>(a.out + size_t(r) * a.C + c) = make_uint2(q[0], q[1]);
  }
  if constexpr (SUMS) {  // lanes l, l + 8, l + 16, l + 24 hold the same columns
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 8);
      sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 16);
    }
    if (threadIdx.x % 32 < 8)
#pragma unroll
      for (int k = 0; k < 8; ++k) part[threadIdx.x / 32][tc + k] = sum[k];
  }
  __syncthreads();
  if (a.out_t) write_transposed(qs, a.out_t, r0, c0, a.N, a.C);
  if constexpr (SUMS) {
    if (threadIdx.x < kTileC && c0 + threadIdx.x < a.C) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += part[w][threadIdx.x];
      a.scratch[size_t(blockIdx.y) * a.C + c0 + threadIdx.x] = t;
    }
  }
  block_amax(abs_bits_to_amax(m), a.amax);
}

__global__ void __launch_bounds__(kThreads) fp8_transpose_kernel(uint8_t* __restrict__ dst,
                                                                  const uint8_t* __restrict__ src, int N, int C) {
  __shared__ uint8_t qs[kTileR][kTileC + kPad];
  const int r0 = blockIdx.y * kTileR, c0 = blockIdx.x * kTileC;
  const int tc = (threadIdx.x % 8) * 8;
  uint2 v[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int tr = threadIdx.x / 8 + 32 * p;
    if (r0 + tr < N && c0 + tc < C) v[p] = *reinterpret_cast<const uint2*>(src + size_t(r0 + tr) * C + c0 + tc);
  }
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int tr = threadIdx.x / 8 + 32 * p;
    if (r0 + tr < N && c0 + tc < C) {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&v[p]);
#pragma unroll
      for (int k = 0; k < 8; ++k) qs[tr][tc + k] = b[k];
    }
  }
  __syncthreads();
  write_transposed(qs, dst, r0, c0, N, C);
}

// V elements a thread at a time (8: 16-byte loads, 8-byte stores; 1 where the pointers do not allow)
template <int V>
__global__ void __launch_bounds__(kThreads) fp8_quantize_kernel(uint8_t* __restrict__ out, const bf16* __restrict__ x,
                                                                 size_t n, const float* scale, float* amax,
                                                                 fp8::Format fmt) {
  const float s = *scale;
  unsigned m = 0;
  const size_t whole = n / V, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < whole; i += stride) {
    const Vec<bf16, V> xv = ldv<bf16, V>(x + i * V);
    uint8_t q[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_f(xv.v[k]);
      m = max(m, abs_bits(v));
      q[k] = uint8_t(quantize2(v * s, 0.0f, fmt) & 0xff);
    }
    if constexpr (V == 8) *reinterpret_cast<uint2*>(out + i * V) = *reinterpret_cast<const uint2*>(q);
    else out[i] = q[0];
  }
  for (size_t i = whole * V + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride) {  // V == 8: the tail
    const float v = to_f(x[i]);
    m = max(m, abs_bits(v));
    out[i] = uint8_t(quantize2(v * s, 0.0f, fmt) & 0xff);
  }
  block_amax(abs_bits_to_amax(m), amax);
}

__global__ void fp8_scales_kernel(Fp8ScalesLaunch a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  const float amax = a.amax[i];
  if (amax * a.scale[i] > a.maxval[i]) atomicAdd(a.saturated, 1u);
  a.history[size_t(a.row) * a.n + i] = amax;
  float m = 0.0f;
  for (int h = 0; h < a.H; ++h) m = fmaxf(m, a.history[size_t(h) * a.n + i]);
  const float s = fp8::scale_for(m, a.maxval[i], a.scale[i], a.margin);
  a.scale[i] = s;
  a.scale_inv[size_t(i) * fp8::kScaleInvStride] = 1.0f / s;
  a.amax[i] = 0.0f;
}

__global__ void fp8_fold_amax_kernel(float* amax, const float* slot) {
  const float m = isnan(*slot) ? INFINITY : fabsf(*slot);
  *amax = fmaxf(*amax, m);
}

dim3 tiles(int N, int C) { return dim3(unsigned(ceil_div(C, kTileC)), unsigned(ceil_div(N, kTileR))); }
}  // namespace

size_t fp8_cast_scratch_bytes(int N, int C) { return size_t(ceil_div(N, kTileR)) * C * sizeof(float); }

template <class X>
void fp8_cast(const Fp8CastArgs<X>& a, cudaStream_t s) {
  const bool grad = a.act == Fp8CastAct::kGeluGrad || a.act == Fp8CastAct::kRelu2Grad;
  if (a.C % 8 || a.N % 8 || !is_aligned(a.x, 16) || (grad && (!a.act_in || !is_aligned(a.act_in, 16))))
    throw KernelError(KernelError::Kind::kUnsupported, "fp8_cast: rows must be 16-byte vectors (C, N multiples of 8)");
  const dim3 grid = tiles(a.N, a.C);
  if (a.act == Fp8CastAct::kRelu2Grad && a.colsum)
    fp8_cast_kernel<X, Fp8CastAct::kRelu2Grad, true><<<grid, kThreads, 0, s>>>(a);
  else if (a.act == Fp8CastAct::kRelu2Grad)
    fp8_cast_kernel<X, Fp8CastAct::kRelu2Grad, false><<<grid, kThreads, 0, s>>>(a);
  else if (a.act == Fp8CastAct::kRelu2)  // an activation's output has no column sums (Fp8Cast::invalid)
    fp8_cast_kernel<X, Fp8CastAct::kRelu2, false><<<grid, kThreads, 0, s>>>(a);
  else if (grad && a.colsum)
    fp8_cast_kernel<X, Fp8CastAct::kGeluGrad, true><<<grid, kThreads, 0, s>>>(a);
  else if (grad)
    fp8_cast_kernel<X, Fp8CastAct::kGeluGrad, false><<<grid, kThreads, 0, s>>>(a);
  else if (a.act == Fp8CastAct::kGelu && a.colsum)
    fp8_cast_kernel<X, Fp8CastAct::kGelu, true><<<grid, kThreads, 0, s>>>(a);
  else if (a.act == Fp8CastAct::kGelu)
    fp8_cast_kernel<X, Fp8CastAct::kGelu, false><<<grid, kThreads, 0, s>>>(a);
  else if (a.colsum)
    fp8_cast_kernel<X, Fp8CastAct::kNone, true><<<grid, kThreads, 0, s>>>(a);
  else
    fp8_cast_kernel<X, Fp8CastAct::kNone, false><<<grid, kThreads, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
  if (a.colsum) {
    add_partial_rows_kernel<float, false><<<partial_rows_grid(a.C), dim3(32, 32), 0, s>>>(a.colsum, nullptr, a.C,
                                                                                        a.scratch, int(grid.y), a.C, a.C);
    CUDA_CHECK_LAUNCH();
  }
}
template void fp8_cast<bf16>(const Fp8CastArgs<bf16>&, cudaStream_t);

void fp8_quantize(uint8_t* out, const bf16* x, size_t n, const float* scale, float* amax, fp8::Format fmt,
                  cudaStream_t s) {
  if (n == 0) return;
  if (is_aligned(x, 16) && is_aligned(out, 8))
    fp8_quantize_kernel<8><<<elementwise_grid(ceil_div(long(n), 8), 8), kThreads, 0, s>>>(out, x, n, scale, amax, fmt);
  else
    fp8_quantize_kernel<1><<<elementwise_grid(n, 8), kThreads, 0, s>>>(out, x, n, scale, amax, fmt);
  CUDA_CHECK_LAUNCH();
}

void fp8_transpose(uint8_t* dst, const uint8_t* src, int N, int C, cudaStream_t s) {
  if (C % 8 || N % 8) throw KernelError(KernelError::Kind::kUnsupported, "fp8_transpose: N and C must be multiples of 8");
  fp8_transpose_kernel<<<tiles(N, C), kThreads, 0, s>>>(dst, src, N, C);
  CUDA_CHECK_LAUNCH();
}

void fp8_fold_amax(float* amax, const float* slot, cudaStream_t s) {
  fp8_fold_amax_kernel<<<1, 1, 0, s>>>(amax, slot);
  CUDA_CHECK_LAUNCH();
}

void fp8_update_scales(const Fp8ScalesLaunch& a, cudaStream_t s) {
  fp8_scales_kernel<<<unsigned(ceil_div(a.n, 256)), 256, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <class X>
void add_sums(X* dst, const float* sums, int n, cudaStream_t s) {
  add_partial_rows_kernel<X><<<partial_rows_grid(n), dim3(32, 32), 0, s>>>(dst, nullptr, n, sums, 1, n, n);
  CUDA_CHECK_LAUNCH();
}
template void add_sums<bf16>(bf16*, const float*, int, cudaStream_t);
template void add_sums<float>(float*, const float*, int, cudaStream_t);

}  // namespace gpt::kern
