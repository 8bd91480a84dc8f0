// AdamW (decoupled weight decay, bias-corrected moments), one pass over param/master/grad/m/v.
// With a master copy the fp32 master is updated and the param (compute copy) is written from it; without
// one, the param is read, updated and written back. bf16 writes round stochastically with a random
// number from (seed ^ element index) unless nearest rounding was asked for.
#include "adamw.cuh"

namespace gpt::kern {

namespace {
template <class X>
__device__ __forceinline__ X round_param(float w, size_t i, const AdamWLaunch<X>& a) {
  if constexpr (std::is_same_v<X, bf16>) {
    if (a.stochastic) return sr_bf16(w, hash_u32(a.seed ^ (a.index_offset + uint64_t(i))));
  }
  return from_f<X>(w);
}

// The elements from e on, V of them; e is also the element's index in the tensor (for the rounding seed).
template <class X>
struct AdamWOp {
  AdamWLaunch<X> a;
  template <int V>
  __device__ __forceinline__ void apply(size_t e) const {
    const Vec<X, V> g = ldv<X, V>(a.grad + e);
    Vec<float, V> m = ldv<float, V>(a.m + e), v = ldv<float, V>(a.v + e);
    Vec<float, V> w;
    if (a.master) {
      w = ldv<float, V>(a.master + e);
    } else {
      const Vec<X, V> p = ldv<X, V>(a.param + e);
#pragma unroll
      for (int k = 0; k < V; ++k) w.v[k] = to_f(p.v[k]);
    }
    Vec<X, V> p;
    bool finite = true;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gk = to_f(g.v[k]) * a.grad_scale;
      m.v[k] = a.beta1 * m.v[k] + (1.0f - a.beta1) * gk;
      v.v[k] = a.beta2 * v.v[k] + (1.0f - a.beta2) * gk * gk;
      const float mhat = m.v[k] / a.bc1, vhat = v.v[k] / a.bc2;
      w.v[k] -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.weight_decay * w.v[k]);
      p.v[k] = round_param<X>(w.v[k], e + k, a);
      finite &= isfinite(w.v[k]) && isfinite(m.v[k]) && isfinite(v.v[k]);
    }
    // the divergence check rides on the optimizer's own pass: no extra read of the state
    if (!finite && a.nonfinite) atomicOr(a.nonfinite, 1u);
    stv<float, V>(a.m + e, m);
    stv<float, V>(a.v + e, v);
    if (a.master) stv<float, V>(a.master + e, w);
    if (a.param) stv<X, V>(a.param + e, p);
  }
};
}  // namespace

template <class X>
void adamw(const AdamWLaunch<X>& a, cudaStream_t s) {
  constexpr int V = 8;  // 16-byte bf16 accesses, two 16-byte fp32 ones
  const bool vec = is_aligned(a.grad, V * sizeof(X)) && is_aligned(a.param, V * sizeof(X)) &&
                   is_aligned(a.m, 4 * V) && is_aligned(a.v, 4 * V) && is_aligned(a.master, 4 * V);
  launch_elementwise_vec<V>(a.n, vec, AdamWOp<X>{a}, s);
}
template void adamw<float>(const AdamWLaunch<float>&, cudaStream_t);
template void adamw<bf16>(const AdamWLaunch<bf16>&, cudaStream_t);

}  // namespace gpt::kern
