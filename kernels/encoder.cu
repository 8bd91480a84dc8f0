// Token + position embedding. Forward: one thread per V channels of one (b, t). Backward, deterministic:
// dwpe[t] sums over b in a fixed order; for dwte, (token, position) pairs are sorted by token with a
// stable radix sort (positions stay ascending), then the first position of each token's run sums the
// run's rows in order and adds the total once. No float atomics.
#include <cub/device/device_radix_sort.cuh>

#include "encoder.cuh"

namespace gpt::kern {

namespace {
constexpr int kThreads = 256;

template <class X, int V, bool kPos>
__global__ void encoder_fwd_kernel(X* __restrict__ out, const int* __restrict__ tokens, const X* __restrict__ wte,
                                   const X* __restrict__ wpe, int BT, int T, int C) {
  const int cv = C / V;
  const long idx = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (idx >= long(BT) * cv) return;
  const int bt = int(idx / cv), c = int(idx % cv) * V, t = bt % T;
  const Vec<X, V> a = ldv<X, V>(wte + size_t(tokens[bt]) * C + c);
  if constexpr (!kPos) {  // no position embedding: the token's row
    stv<X, V>(out + size_t(bt) * C + c, a);
    return;
  }
  const Vec<X, V> b = ldv<X, V>(wpe + size_t(t) * C + c);
  Vec<X, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = from_f<X>(to_f(a.v[k]) + to_f(b.v[k]));
  stv<X, V>(out + size_t(bt) * C + c, o);
}

// dwpe (T, C) += sum_b dout[b, t]
template <class X, int V>
__global__ void encoder_bwd_wpe_kernel(X* __restrict__ dwpe, const X* __restrict__ dout, int B, int T, int C) {
  const int cv = C / V;
  const long idx = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (idx >= long(T) * cv) return;
  const int t = int(idx / cv), c = int(idx % cv) * V;
  float acc[V] = {};
  for (int b = 0; b < B; ++b) {
    const Vec<X, V> g = ldv<X, V>(dout + (size_t(b) * T + t) * C + c);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += to_f(g.v[k]);
  }
  Vec<X, V> d = ldv<X, V>(dwpe + size_t(t) * C + c);
#pragma unroll
  for (int k = 0; k < V; ++k) d.v[k] = from_f<X>(to_f(d.v[k]) + acc[k]);
  stv<X, V>(dwpe + size_t(t) * C + c, d);
}

struct Iota {  // p[i] = i
  int* p;
  __device__ __forceinline__ void operator()(size_t i) const { p[i] = int(i); }
};

// One thread per (sorted slot i, V channels); only the first slot of each token's run works: it walks
// the run (positions ascending) and adds the sum into dwte[token]. Threads of a warp share i, so the
// early exit is warp-uniform and each run's row is split across C/V threads.
template <class X, int V>
__global__ void encoder_bwd_wte_kernel(X* __restrict__ dwte, const X* __restrict__ dout,
                                       const int* __restrict__ tok, const int* __restrict__ pos, int n, int C) {
  const int cv = C / V;
  const long idx = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (idx >= long(n) * cv) return;
  const int i = int(idx / cv), c = int(idx % cv) * V;
  const int token = tok[i];
  if (i > 0 && tok[i - 1] == token) return;
  float acc[V] = {};
  for (int j = i; j < n && tok[j] == token; ++j) {
    const Vec<X, V> g = ldv<X, V>(dout + size_t(pos[j]) * C + c);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += to_f(g.v[k]);
  }
  X* dst = dwte + size_t(token) * C + c;
  Vec<X, V> d = ldv<X, V>(dst);
#pragma unroll
  for (int k = 0; k < V; ++k) d.v[k] = from_f<X>(to_f(d.v[k]) + acc[k]);
  stv<X, V>(dst, d);
}

// Scratch layout: sorted tokens, positions in, positions out (n ints each, 256-byte aligned), cub temp.
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
size_t cub_temp_bytes(int n) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const int*)nullptr, (int*)nullptr,
                                             (const int*)nullptr, (int*)nullptr, n, 0, 31));
  return bytes;
}
}  // namespace

template <class X>
void encoder_fwd(const EncoderFwdArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const int C = a.C;
  const bool vec = C % V == 0 && is_aligned(a.out, 16) && is_aligned(a.wte, 16) && is_aligned(a.wpe, 16);
  const long work = long(a.B) * a.T * (vec ? C / V : C);
  const unsigned grid = unsigned(ceil_div(work, kThreads));
  const bool pos = a.wpe != nullptr;
  if (vec && pos)
    encoder_fwd_kernel<X, V, true><<<grid, kThreads, 0, s>>>(a.out, a.tokens, a.wte, a.wpe, a.B * a.T, a.T, C);
  else if (vec)
    encoder_fwd_kernel<X, V, false><<<grid, kThreads, 0, s>>>(a.out, a.tokens, a.wte, a.wpe, a.B * a.T, a.T, C);
  else if (pos)
    encoder_fwd_kernel<X, 1, true><<<grid, kThreads, 0, s>>>(a.out, a.tokens, a.wte, a.wpe, a.B * a.T, a.T, C);
  else
    encoder_fwd_kernel<X, 1, false><<<grid, kThreads, 0, s>>>(a.out, a.tokens, a.wte, a.wpe, a.B * a.T, a.T, C);
  CUDA_CHECK_LAUNCH();
}

size_t encoder_bwd_scratch_bytes(int n) { return 3 * align256(size_t(n) * sizeof(int)) + cub_temp_bytes(n); }

template <class X>
void encoder_bwd(const EncoderBwdArgs<X>& a, cudaStream_t s) {
  const int n = a.B * a.T, C = a.C;
  constexpr int V = kVec16<X>;
  const bool vec = C % V == 0 && is_aligned(a.dwte, 16) && is_aligned(a.dwpe, 16) && is_aligned(a.dout, 16);
  const int cv = vec ? C / V : C;

  const unsigned gwpe = unsigned(ceil_div(long(a.T) * cv, kThreads));
  if (a.dwpe) {  // with a position embedding
    if (vec)
      encoder_bwd_wpe_kernel<X, V><<<gwpe, kThreads, 0, s>>>(a.dwpe, a.dout, a.B, a.T, C);
    else
      encoder_bwd_wpe_kernel<X, 1><<<gwpe, kThreads, 0, s>>>(a.dwpe, a.dout, a.B, a.T, C);
    CUDA_CHECK_LAUNCH();
  }

  char* p = static_cast<char*>(a.scratch);
  const size_t ib = align256(size_t(n) * sizeof(int));
  int* tok_sorted = reinterpret_cast<int*>(p);
  int* pos_in = reinterpret_cast<int*>(p + ib);
  int* pos_sorted = reinterpret_cast<int*>(p + 2 * ib);
  void* temp = p + 3 * ib;
  size_t temp_bytes = cub_temp_bytes(n);
  launch_elementwise(size_t(n), Iota{pos_in}, s);
  // token ids are non-negative int32: bits 0..30 carry them all
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, a.tokens, tok_sorted, pos_in, pos_sorted, n, 0, 31,
                                             s));
  const unsigned gwte = unsigned(ceil_div(long(n) * cv, kThreads));
  if (vec)
    encoder_bwd_wte_kernel<X, V><<<gwte, kThreads, 0, s>>>(a.dwte, a.dout, tok_sorted, pos_sorted, n, C);
  else
    encoder_bwd_wte_kernel<X, 1><<<gwte, kThreads, 0, s>>>(a.dwte, a.dout, tok_sorted, pos_sorted, n, C);
  CUDA_CHECK_LAUNCH();
}

template void encoder_fwd<float>(const EncoderFwdArgs<float>&, cudaStream_t);
template void encoder_fwd<bf16>(const EncoderFwdArgs<bf16>&, cudaStream_t);
template void encoder_bwd<float>(const EncoderBwdArgs<float>&, cudaStream_t);
template void encoder_bwd<bf16>(const EncoderBwdArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
