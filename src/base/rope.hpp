// Rotary position embedding (model.pos_embedding: rope) as host and device code alike: the one place its
// math is written, for the CPU reference and the CUDA kernel (kernels/rope.cu). A head's vector of HS values
// at position t is rotated pairwise, element i with element i + HS/2 (i < HS/2, GPT-NeoX's and LLaMA's
// pairing), by the angle t * 10000^(-2i / HS). The angle's cosine and sine are computed in double and
// rounded to float, and the rotation is four products and two sums in float, unfused: the backends differ
// only where their double-precision libraries round a cosine or sine to another float.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define GPT_ROPE_HD __host__ __device__ __forceinline__
#else
#define GPT_ROPE_HD inline
#endif

namespace gpt {

inline constexpr double kRopeBase = 10000.0;

struct RopeAngle {
  float c, s;
};
// The rotation of pair i at position t in a head of HS values; `inverse`: by the negative angle (the
// forward rotation's transpose, which its backward applies to the gradients)
GPT_ROPE_HD RopeAngle rope_angle(int t, int i, int HS, bool inverse) {
  const double a = double(t) * exp(-2.0 * double(i) / double(HS) * log(kRopeBase));
  const float s = float(sin(a));
  return {float(cos(a)), inverse ? -s : s};
}

// (x, y) rotated: (x c - y s, x s + y c), each product and sum rounded to float on its own
GPT_ROPE_HD void rope_rotate(float& x, float& y, RopeAngle r) {
#if defined(__CUDA_ARCH__)
  const float nx = __fsub_rn(__fmul_rn(x, r.c), __fmul_rn(y, r.s));
  const float ny = __fadd_rn(__fmul_rn(x, r.s), __fmul_rn(y, r.c));
#else
  const float xc = x * r.c, ys = y * r.s, xs = x * r.s, yc = y * r.c;
  const float nx = xc - ys, ny = xs + yc;
#endif
  x = nx;
  y = ny;
}

}  // namespace gpt
