// fp32 <-> bf16 conversion and the elementwise add used for gradient accumulation. V elements per
// thread with 16-byte (or 8-byte) accesses; the tail and unaligned pointers take the scalar path
// (launch_elementwise_vec, common.cuh).
#include "conversions.cuh"

namespace gpt::kern {

namespace {
struct F32ToBf16 {
  bf16* __restrict__ dst;
  const float* __restrict__ src;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    const Vec<float, V> x = ldv<float, V>(src + e);
    Vec<bf16, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = __float2bfloat16_rn(x.v[k]);
    stv<bf16, V>(dst + e, y);
  }
};
struct Bf16ToF32 {
  float* __restrict__ dst;
  const bf16* __restrict__ src;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    const Vec<bf16, V> x = ldv<bf16, V>(src + e);
    Vec<float, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = __bfloat162float(x.v[k]);
    stv<float, V>(dst + e, y);
  }
};
template <class X>
struct AddInplace {
  X* __restrict__ dst;
  const X* __restrict__ src;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    Vec<X, V> d = ldv<X, V>(dst + e);
    const Vec<X, V> x = ldv<X, V>(src + e);
#pragma unroll
    for (int k = 0; k < V; ++k) d.v[k] = from_f<X>(to_f(d.v[k]) + to_f(x.v[k]));
    stv<X, V>(dst + e, d);
  }
};
}  // namespace

// 4 floats / 4 bf16 per thread in the aligned bulk
void f32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t s) {
  launch_elementwise_vec<4>(n, is_aligned(dst, 8) && is_aligned(src, 16), F32ToBf16{dst, src}, s);
}
void bf16_to_f32(float* dst, const bf16* src, size_t n, cudaStream_t s) {
  launch_elementwise_vec<4>(n, is_aligned(dst, 16) && is_aligned(src, 8), Bf16ToF32{dst, src}, s);
}
template <class X>
void add_inplace(X* dst, const X* src, size_t n, cudaStream_t s) {
  launch_elementwise_vec<kVec16<X>>(n, is_aligned(dst, 16) && is_aligned(src, 16), AddInplace<X>{dst, src}, s);
}
template void add_inplace<float>(float*, const float*, size_t, cudaStream_t);
template void add_inplace<bf16>(bf16*, const bf16*, size_t, cudaStream_t);

}  // namespace gpt::kern
