// FP8 formats and the delayed-scaling rule, for host and device code alike: the CPU backend's emulation
// (src/backend/cpu/fp8_cpu.cpp) and the CUDA kernels use these same functions, so both backends derive
// the same scales from the same amax history and quantize to the same bytes.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GPT_FP8_HD __host__ __device__ __forceinline__
#else
#define GPT_FP8_HD inline
#endif

namespace gpt::fp8 {

// E4M3 (no infinities, NaN 0x7f, max 448) and E5M2 (IEEE-like, max 57344), as OCP FP8 and the
// Hopper tensor cores define them.
enum class Format : uint8_t { E4M3 = 0, E5M2 = 1 };

// Which FP8 products sum without the periodic promotion of their running sums to full fp32 ("fast
// accumulation": Hopper's tensor cores keep fewer bits in the sum in between): the forward products only;
// also the input gradients, whose sums run over a layer's width; also the weight gradients, whose sums run
// over a micro-batch's tokens. The CPU emulation sums in fp32 for all three.
enum class FastAccum : uint8_t { forward = 0, dinp = 1, all = 2 };

// An input gradient whose sum is longer than this keeps the promotion under every setting. The block
// products' sums run over at most 4 x n_embd terms (6400 at GPT-2 1558M); the FP8 classifier's runs over the
// padded vocabulary (50304 terms), and summed fast it cost 2% of the loss on real text at GPT-2 124M
// (bench/convergence.py, bench/RESULTS.md), where the same policy with the promotion there matched bf16.
constexpr int kFastDinpMaxTerms = 8192;
GPT_FP8_HD bool fast_dinp(FastAccum f, int terms) { return f != FastAccum::forward && terms <= kFastDinpMaxTerms; }

// Dequantizing scales are kept 16 bytes apart (scale_inv[i * kScaleInvStride]): cuBLASLt reads each through
// its own pointer and refuses FP8 products whose scale pointers are not 16-byte aligned.
constexpr int kScaleInvStride = 4;

GPT_FP8_HD float max_finite(Format f) { return f == Format::E4M3 ? 448.0f : 57344.0f; }

// The scale of a tensor whose recent maximum |x| is `amax`: the largest power of two s with
// amax * s <= maxval, divided by 2^margin (headroom for values growing between steps). Powers of two
// make x * s exact, so quantization is one rounding (to FP8, nearest even, saturating) on every
// backend. `old` when amax is 0, infinite or NaN (nothing to learn from).
GPT_FP8_HD float scale_for(float amax, float maxval, float old, int margin = 0) {
  if (!(amax > 0.0f) || !(amax <= 3.0e38f)) return old;
  int e = 0;
  frexpf(maxval / amax, &e);  // maxval / amax = m * 2^e with m in [0.5, 1)
  e -= 1 + margin;
  e = e < -120 ? -120 : (e > 120 ? 120 : e);
  float s = ldexpf(1.0f, e);
  if (amax * s > maxval) s *= 0.5f;  // the division rounded up across a power of two
  return s;
}

}  // namespace gpt::fp8
