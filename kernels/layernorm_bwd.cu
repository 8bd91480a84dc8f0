// LayerNorm backward, deterministic: see layernorm_bwd_kernel and, for bf16 rows of a multiple of 8
// columns (the trainer's), layernorm_bwd_tma_kernel. RMSNorm's (a.rms) is the same with the mean and
// the mean of dn taken as 0 and no bias gradient.
#include <optional>
#include <string>
#include <type_traits>

#include "layernorm.cuh"

namespace gpt::kern {

namespace {
// The backward's per-vector arithmetic, shared by both kernels. Pass one: the vector's share of its
// row's two sums, of dn = dout * w and of dn * xhat.
template <class X, int V>
__device__ __forceinline__ void bwd_row_sums(const Vec<X, V>& g, const Vec<X, V>& x, const Vec<X, V>& wv,
                                             float mean, float rstd, float& s_dn, float& s_dnx) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float dn = to_f(g.v[j]) * to_f(wv.v[j]);
    s_dn += dn;
    s_dnx += dn * (to_f(x.v[j]) - mean) * rstd;
  }
}
// Pass two, from the row's means of those sums: di += the input gradient (rounded to X), and each
// column's dw, db and updated-dinp terms (fp32, before rounding) handed to acc(j, dw, db, d).
template <class X, int V, class Acc>
__device__ __forceinline__ void bwd_vector(const Vec<X, V>& g, const Vec<X, V>& x, const Vec<X, V>& wv,
                                           Vec<X, V>& di, float mean, float rstd, float m_dn, float m_dnx,
                                           Acc&& acc) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float gk = to_f(g.v[j]);
    const float xhat = (to_f(x.v[j]) - mean) * rstd;
    const float d = to_f(di.v[j]) + (gk * to_f(wv.v[j]) - m_dn - xhat * m_dnx) * rstd;
    di.v[j] = from_f<X>(d);
    acc(j, gk * xhat, gk, d);
  }
}
// The row's means of the two sums: its group's warps' sums (red[0][q], red[1][q] for the group's wpr
// warps q) go through one warp's lanes in a fixed butterfly order, which leaves every lane the same bits.
// Every lane of the warp must call it. inv_c = 1 / C: a multiply, not a division.
__device__ __forceinline__ void bwd_row_means(const float (&red)[2][32], int r, int wpr, float inv_c, float& m_dn,
                                              float& m_dnx) {
  const int lane = threadIdx.x % 32;
  m_dn = warp_sum(lane < wpr ? red[0][r * wpr + lane] : 0.0f) * inv_c;
  m_dnx = warp_sum(lane < wpr ? red[1][r * wpr + lane] : 0.0f) * inv_c;
}

// Backward: a block works on R rows at a time, one group of `tpr` threads (whole warps) per row; each
// thread owns K vectors of V columns of its group's rows, so a row is read once (dout, inp, dinp) and
// dinp written once. Each row's two sums go through its group's warps in a fixed order (double-
// buffered by iteration parity: one barrier per iteration). The dw/db partial sums of a thread's
// columns live in its group's slice of shared memory (vector i at i * P, P = V rounded up to odd, so a
// warp's accesses hit 32 banks), not in registers, and dout and inp are read again after the barrier
// (from L1) rather than held across it: at 40 registers a thread more rows per SM are in flight than
// with the sums in registers (which capped the kernel at 896 threads an SM), so one block's reduction
// and barrier overlap other blocks' loads. Measured on an H200, bf16: 0.133 against 0.146 ms at
// N = 65536, C = 768; 0.091 against 0.095-0.101 ms at N = 16384, C = 1600. With dinp_colsum a third
// partial sum, of the updated dinp (in fp32, before rounding), rides along: the bias gradient of the
// residual branch's output projection, which then needs no pass of its own over dinp. At the end the R
// groups' slices are summed in a fixed order into the block's row of scratch, and a second kernel sums
// the blocks' rows in a fixed order. Deterministic.
constexpr int kBwdRegsK1 = 40;  // registers a thread of the one-vector-per-thread kernel may use
template <class X, int V, int K>
__global__ void __launch_bounds__(1024) __maxnreg__(K == 1 ? kBwdRegsK1 : 64)
    layernorm_bwd_kernel(LayerNormBwdArgs<X> a, int tpr) {
  // R groups x NS x (P x K x tpr) floats: dw, db (and dinp's column sums), vector i at i * P
  extern __shared__ float sm[];
  constexpr int P = V % 2 ? V : V + 1;
  __shared__ float red[2][2][32];
  const bool colsum = a.dinp_colsum != nullptr;
  const int NS = colsum ? 3 : 2;
  const int R = blockDim.x / tpr, r = threadIdx.x / tpr, t = threadIdx.x % tpr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wpr = tpr / 32;
  const int C = a.C, nvec = C / V, slice = P * K * tpr;
  const float inv_c = 1.0f / C;
  float* acc_w = sm + size_t(r) * NS * slice;
  float* acc_b = acc_w + slice;
  float* acc_r = acc_b + slice;  // only with colsum
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int at = (t + k * tpr) * P + j;
      acc_w[at] = 0.0f, acc_b[at] = 0.0f;
      if (colsum) acc_r[at] = 0.0f;
    }
  int parity = 0;
  for (int base = blockIdx.x * R; base < a.N; base += gridDim.x * R, parity ^= 1) {
    const int row = base + r;
    const bool live = row < a.N;  // every thread still takes part in the barrier
    const size_t off = size_t(live ? row : 0) * C;
    const float mean = live && !a.rms ? a.mean[row] : 0.0f, rstd = live ? a.rstd[row] : 0.0f;
    Vec<X, V> di[K];
    float s_dn = 0.0f, s_dnx = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = t + k * tpr;
      if (live && i < nvec) {
        const Vec<X, V> g = ldv<X, V>(a.dout + off + size_t(i) * V), x = ldv<X, V>(a.inp + off + size_t(i) * V);
        di[k] = ldv<X, V>(a.dinp + off + size_t(i) * V);
        bwd_row_sums<X, V>(g, x, ldv<X, V>(a.w + size_t(i) * V), mean, rstd, s_dn, s_dnx);
      }
    }
    s_dn = warp_sum(s_dn);
    s_dnx = warp_sum(s_dnx);
    if (lane == 0) red[parity][0][warp] = s_dn, red[parity][1][warp] = s_dnx;
    __syncthreads();
    if (!live) continue;
    bwd_row_means(red[parity], r, wpr, inv_c, s_dn, s_dnx);
    if (a.rms) s_dn = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = t + k * tpr;
      if (i < nvec) {
        // dout and inp again: this thread's own loads from before the barrier, still in L1
        const Vec<X, V> g = ldv<X, V>(a.dout + off + size_t(i) * V), x = ldv<X, V>(a.inp + off + size_t(i) * V);
        bwd_vector<X, V>(g, x, ldv<X, V>(a.w + size_t(i) * V), di[k], mean, rstd, s_dn, s_dnx,
                         [&](int j, float dw, float db, float d) {
                           acc_w[i * P + j] += dw;
                           acc_b[i * P + j] += db;
                           if (colsum) acc_r[i * P + j] += d;
                         });
        stv<X, V>(a.dinp + off + size_t(i) * V, di[k]);
      }
    }
  }
  // the R groups' partial sums -> this block's row of scratch, column c = i * V + j
  __syncthreads();
  float* part = a.scratch + size_t(blockIdx.x) * NS * C;
  for (int c = threadIdx.x; c < NS * C; c += blockDim.x) {
    const int which = c / C, col = c - which * C;
    const int at = which * slice + (col / V) * P + col % V;
    float acc = 0.0f;
    for (int q = 0; q < R; ++q) acc += sm[size_t(q) * NS * slice + at];
    part[c] = acc;
  }
}

// The pipelined backward for bf16 rows whose width is a multiple of 8 (every GPT-2 width): the same
// arithmetic, groups and fixed summation orders as above, but the rows' dout, inp and dinp come into
// shared memory by bulk asynchronous copies (TMA), `stages` iterations of R rows ahead, one mbarrier a
// stage. While a block computes one iteration, the copies of the next stages - 1 are in flight, so HBM
// sees a steady stream of loads without threads holding them. A thread owns one vector of its group's
// rows (C up to 8192); dinp is stored from registers, the dw, db (and dinp column sum) partials stay in
// registers and w is read once. At the end the R groups' partials go through the (then free) stage
// buffers into the block's row of scratch, as above.
// The rows' mean and rstd are loaded one iteration ahead, into registers (their latency would otherwise
// stall every iteration).
constexpr int kMaxStages = 8;
// The pipelined kernel's stage buffers in shared memory: stage st holds R rows of dout, inp and dinp
// (tensor `which` 0, 1, 2), one tensor's rows tensor_elems = R * C apart; bar[st] is the stage's mbarrier.
struct TmaStages {
  bf16* stage_buf;
  uint64_t* bar;
  int R, C, N, tensor_elems;
  __device__ __forceinline__ bf16* buf(int stage, int which) const {
    return stage_buf + (stage * 3 + which) * tensor_elems;
  }
  // thread 0: the copies of the R rows from `base` into `stage`
  __device__ __forceinline__ void issue(const LayerNormBwdArgs<bf16>& a, long base, int stage) const {
    if (base >= N) return;
    const uint32_t bytes = uint32_t(std::min<long>(R, N - base) * C * 2);
    mbar_arrive_expect_tx(&bar[stage], 3 * bytes);
    bulk_load(buf(stage, 0), a.dout + base * C, bytes, &bar[stage]);
    bulk_load(buf(stage, 1), a.inp + base * C, bytes, &bar[stage]);
    bulk_load(buf(stage, 2), a.dinp + base * C, bytes, &bar[stage]);
  }
};
// The end of the pipelined kernel, once every copy issued has been waited for: the stage buffers
// (part_sm) take the R groups' partial sums, (R, NS, C), which are then summed in a fixed order into
// the block's row of scratch. acc_*: this thread's partials of vector i of its group r's columns.
template <int V>
__device__ __forceinline__ void tma_partials_to_scratch(const LayerNormBwdArgs<bf16>& a, float* part_sm, int R,
                                                        int r, int i, const float (&acc_w)[V],
                                                        const float (&acc_b)[V], const float (&acc_r)[V]) {
  const bool colsum = a.dinp_colsum != nullptr;
  const int C = a.C, nvec = C / V;
  const int NS = colsum ? 3 : 2;
  __syncthreads();
  if (i < nvec) {
    float* p = part_sm + size_t(r) * NS * C + size_t(i) * V;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      p[j] = acc_w[j];
      p[C + j] = acc_b[j];
      if (colsum) p[2 * C + j] = acc_r[j];
    }
  }
  __syncthreads();
  float* part = a.scratch + size_t(blockIdx.x) * NS * C;
  for (int c = threadIdx.x; c < NS * C; c += blockDim.x) {
    float acc = 0.0f;
    for (int q = 0; q < R; ++q) acc += part_sm[size_t(q) * NS * C + c];
    part[c] = acc;
  }
}

// The pipelined backward for bf16 rows whose width is a multiple of 8 (every GPT-2 width): the same
// arithmetic, groups and fixed summation orders as above, but the rows' dout, inp and dinp come into
// shared memory by bulk asynchronous copies (TMA), `stages` iterations of R rows ahead, one mbarrier a
// stage. While a block computes one iteration, the copies of the next stages - 1 are in flight, so HBM
// sees a steady stream of loads without threads holding them. A thread owns one vector of its group's
// rows (C up to 8192); dinp is stored from registers, the dw, db (and dinp column sum) partials stay in
// registers and w is read once. At the end the R groups' partials go through the (then free) stage
// buffers into the block's row of scratch, as above.
// The rows' mean and rstd are loaded one iteration ahead, into registers (their latency would otherwise
// stall every iteration).
__global__ void __launch_bounds__(1024) layernorm_bwd_tma_kernel(LayerNormBwdArgs<bf16> a, int tpr, int stages) {
  constexpr int V = 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bar[kMaxStages];
  __shared__ float red[2][2][32];
  const int R = blockDim.x / tpr, r = threadIdx.x / tpr, t = threadIdx.x % tpr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wpr = tpr / 32;
  const int C = a.C, N = a.N, nvec = C / V;
  const long stride = long(gridDim.x) * R;  // rows from one of a block's iterations to the next
  const float inv_c = 1.0f / C;
  const TmaStages pipe{reinterpret_cast<bf16*>(smem_raw), bar, R, C, N, R * C};
  long base = long(blockIdx.x) * R;  // the first row of this iteration
  if (threadIdx.x == 0)
    for (int st = 0; st < stages; ++st) mbar_init(&bar[st], 1);
  __syncthreads();
  if (threadIdx.x == 0)
    for (int st = 0; st < stages; ++st) pipe.issue(a, base + st * stride, st);

  const int i = t;  // this thread's vector of its group's rows
  Vec<bf16, V> wv;
  if (i < nvec) wv = ldv<bf16, V>(a.w + size_t(i) * V);
  float acc_w[V], acc_b[V], acc_r[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc_w[j] = 0.0f, acc_b[j] = 0.0f, acc_r[j] = 0.0f;
  float mean_next = 0.0f, rstd_next = 0.0f;
  if (base + r < N) mean_next = a.rms ? 0.0f : a.mean[base + r], rstd_next = a.rstd[base + r];
  // The iteration's stage, the previous one's (free again after this iteration's barrier: it takes the
  // rows stages - 1 iterations ahead) and the stage's mbarrier phase, counted along (no divisions).
  int stage = 0, prev_stage = stages - 1, parity = 0;
  uint32_t phase = 0;
  const long ahead = long(stages - 1) * stride;
  for (bool first = true; base < N; base += stride, first = false) {
    const long row = base + r;
    const bool live = row < N;  // every thread still takes part in the barrier
    const float mean = mean_next, rstd = rstd_next;
    if (row + stride < N) mean_next = a.rms ? 0.0f : a.mean[row + stride], rstd_next = a.rstd[row + stride];
    const bf16* g_row = pipe.buf(stage, 0) + size_t(r) * C;
    const bf16* x_row = pipe.buf(stage, 1) + size_t(r) * C;
    const bf16* d_row = pipe.buf(stage, 2) + size_t(r) * C;
    mbar_wait(&bar[stage], phase);
    float s_dn = 0.0f, s_dnx = 0.0f;
    if (live && i < nvec) {
      bwd_row_sums<bf16, V>(ldv<bf16, V>(g_row + i * V), ldv<bf16, V>(x_row + i * V), wv, mean, rstd, s_dn, s_dnx);
    }
    s_dn = warp_sum(s_dn);
    s_dnx = warp_sum(s_dnx);
    if (lane == 0) red[parity][0][warp] = s_dn, red[parity][1][warp] = s_dnx;
    __syncthreads();
    // every thread is past the previous iteration: its stage can take the rows stages - 1 iterations ahead
    if (threadIdx.x == 0 && !first) pipe.issue(a, base + ahead, prev_stage);
    if (live) {
      bwd_row_means(red[parity], r, wpr, inv_c, s_dn, s_dnx);
      if (a.rms) s_dn = 0.0f;
      if (i < nvec) {
        Vec<bf16, V> di = ldv<bf16, V>(d_row + i * V);
        bwd_vector<bf16, V>(ldv<bf16, V>(g_row + i * V), ldv<bf16, V>(x_row + i * V), wv, di, mean, rstd, s_dn,
                            s_dnx, [&](int j, float dw, float db, float d) {
                              acc_w[j] += dw;
                              acc_b[j] += db;
                              acc_r[j] += d;
                            });
        stv<bf16, V>(a.dinp + size_t(row) * C + size_t(i) * V, di);
      }
    }
    prev_stage = stage;
    parity ^= 1;
    if (++stage == stages) stage = 0, phase ^= 1u;
  }
  tma_partials_to_scratch<V>(a, reinterpret_cast<float*>(smem_raw), R, r, i, acc_w, acc_b, acc_r);
}

struct BwdGrid {
  int tpr, rows, blocks, k;  // threads per row, rows per block, blocks, vectors per thread
  size_t smem;               // dynamic shared memory bytes
};
constexpr int kMaxVecsPerThread = 8;
constexpr int kBwdThreads = 512;  // aim: rows x threads-per-row close to this
constexpr size_t kSmemPerSm = 200 * 1024;  // of an H100/H200 SM's 228 KB, leaving room for the runtime
// sums: 2 (dw, db) or 3 (and dinp's column sums)
BwdGrid bwd_grid(int N, int C, int V, int sums, int num_sms) {
  const int nvec = C / V;
  int k = 1;
  while (k < kMaxVecsPerThread && ceil_div(nvec, k) > 1024) k *= 2;
  const int tpr = int(std::min<long>(1024, ceil_div(ceil_div(nvec, k), 32) * 32));
  const size_t group_bytes = size_t(sums) * (V % 2 ? V : V + 1) * k * tpr * sizeof(float);  // a row group's sums
  int rows = std::max(1, kBwdThreads / tpr);
  while (rows > 1 && size_t(rows) * group_bytes > 96 * 1024) --rows;  // shared memory per block
  const int threads = rows * tpr;
  const size_t smem = size_t(rows) * group_bytes;
  // As many blocks as are surely resident at once (each loops over its rows, so a second, partial wave
  // would leave SMs idle at the end): an SM's 64K registers (kBwdRegsK1 or 64 a thread, the kernel's
  // caps) and its shared memory.
  const long regs = long(k == 1 ? kBwdRegsK1 : 64) * threads;
  const long per_sm = std::max<long>(1, std::min<long>({65536 / regs, 2048 / threads, long(kSmemPerSm / smem)}));
  const long blocks = std::max<long>(1, std::min<long>(ceil_div(N, rows), per_sm * num_sms));
  return {tpr, rows, int(blocks), k, smem};
}
// The pipelined kernel's grid and stages, or none when the rows do not fit (bwd_grid's kernel then).
// Rows per block as above, fewer if 4 stages of them would pass 100 KB (two blocks an SM); then as many
// stages (4-8) as fit in those 100 KB, or 200 KB for a single row.
constexpr size_t kTmaSmemTarget = 100 * 1024;
struct TmaGrid {
  BwdGrid g;
  int stages;
};
std::optional<TmaGrid> tma_grid(int N, int C, int num_sms) {
  const int nvec = C / 8;
  if (C % 8 != 0 || nvec > 1024) return std::nullopt;
  const int tpr = int(ceil_div(nvec, 32) * 32);
  int rows = std::max(1, kBwdThreads / tpr);
  const size_t row_bytes = 3 * size_t(C) * sizeof(bf16);  // dout, inp and dinp of a row
  while (rows > 1 && 4 * rows * row_bytes > kTmaSmemTarget) --rows;
  const size_t budget = 4 * rows * row_bytes > kTmaSmemTarget ? kSmemPerSm : kTmaSmemTarget;
  const int stages = int(std::min<size_t>(kMaxStages, budget / (rows * row_bytes)));
  if (stages < 2) return std::nullopt;
  const size_t smem = size_t(stages) * rows * row_bytes;
  const int threads = rows * tpr;
  // __launch_bounds__(1024): at most 64 registers a thread
  const long per_sm = std::max<long>(
      1, std::min<long>({2048 / threads, 65536 / (64L * threads), long(kSmemPerSm / (smem + 1024))}));
  const long blocks = std::max<long>(1, std::min<long>(ceil_div(N, rows), per_sm * num_sms));
  return TmaGrid{{tpr, rows, int(blocks), 1, smem}, stages};
}
// the vector width the launcher will use for these arguments
template <class X>
int bwd_vec(const LayerNormBwdArgs<X>& a) {
  constexpr int V = kVec16<X>;
  return a.C % V == 0 && is_aligned(a.dinp, 16) && is_aligned(a.dout, 16) && is_aligned(a.inp, 16) &&
                 is_aligned(a.w, 16)
             ? V
             : 1;
}
template <class X, int V, int K>
void launch_bwd_k(const LayerNormBwdArgs<X>& a, const BwdGrid& g, cudaStream_t s) {
  // always: above 48 KB of static plus dynamic shared memory a launch needs it, whatever the launch
  // before asked for
  auto kernel = layernorm_bwd_kernel<X, V, K>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(g.smem)));
  kernel<<<g.blocks, g.rows * g.tpr, g.smem, s>>>(a, g.tpr);
}
template <class X, int V>
void launch_bwd(const LayerNormBwdArgs<X>& a, const BwdGrid& g, cudaStream_t s) {
  switch (g.k) {
    case 1: launch_bwd_k<X, V, 1>(a, g, s); break;
    case 2: launch_bwd_k<X, V, 2>(a, g, s); break;
    case 4: launch_bwd_k<X, V, 4>(a, g, s); break;
    default: launch_bwd_k<X, V, 8>(a, g, s); break;
  }
}
void launch_tma(const LayerNormBwdArgs<bf16>& a, const TmaGrid& t, cudaStream_t s) {
  auto kernel = layernorm_bwd_tma_kernel;  // the attribute always, as above
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(t.g.smem)));
  kernel<<<t.g.blocks, t.g.rows * t.g.tpr, t.g.smem, s>>>(a, t.g.tpr, t.stages);
}
}  // namespace

size_t layernorm_bwd_scratch_bytes(int N, int C, int num_sms) {
  // the block count depends on the kernel, the vector width and the sums chosen at launch: reserve for
  // the most
  const std::optional<TmaGrid> tma = tma_grid(N, C, num_sms);
  int blocks = tma ? tma->g.blocks : 0;
  for (int v : {1, kVec16<bf16>})
    for (int sums : {2, 3}) blocks = std::max(blocks, bwd_grid(N, C, v, sums, num_sms).blocks);
  return size_t(blocks) * 3 * C * sizeof(float);
}

template <class X>
void layernorm_bwd(const LayerNormBwdArgs<X>& a, cudaStream_t s) {
  constexpr int V = kVec16<X>;
  const int v = bwd_vec(a);
  const int sums = a.dinp_colsum ? 3 : 2;
  std::optional<TmaGrid> tma;  // bf16 rows of 16-byte vectors: the pipelined kernel where they fit
  BwdGrid grid;
  if constexpr (std::is_same_v<X, bf16>) {
    if (v == V) tma = tma_grid(a.N, a.C, a.num_sms);
    if (tma) {
      launch_tma(a, *tma, s);
      grid = tma->g;
    }
  }
  if (!tma) {
    grid = bwd_grid(a.N, a.C, v, sums, a.num_sms);
    if (ceil_div(a.C / v, grid.k) > 1024 || grid.smem > 200 * 1024)
      throw KernelError(KernelError::Kind::kUnsupported, "layernorm backward: C = " + std::to_string(a.C) +
                                                             " is wider than supported (" +
                                                             std::to_string(1024 * kMaxVecsPerThread * v) + ")");
    if (v == V)
      launch_bwd<X, V>(a, grid, s);
    else
      launch_bwd<X, 1>(a, grid, s);
  }
  CUDA_CHECK_LAUNCH();
  // dw, db += the sum of the blocks' partial rows (dw's C columns, then db's; RMSNorm: dw's only); then
  // dinp's column sums
  const int ld = sums * a.C, cols = a.db ? 2 * a.C : a.C;  // no db: RMSNorm, or model.bias false
  add_partial_rows_kernel<X><<<partial_rows_grid(cols), dim3(32, 32), 0, s>>>(a.dw, a.db, a.C, a.scratch,
                                                                             grid.blocks, cols, ld);
  CUDA_CHECK_LAUNCH();
  if (a.dinp_colsum) {
    add_partial_rows_kernel<float, false><<<partial_rows_grid(a.C), dim3(32, 32), 0, s>>>(
        a.dinp_colsum, nullptr, a.C, a.scratch + 2 * a.C, grid.blocks, a.C, ld);
    CUDA_CHECK_LAUNCH();
  }
}
template void layernorm_bwd<float>(const LayerNormBwdArgs<float>&, cudaStream_t);
template void layernorm_bwd<bf16>(const LayerNormBwdArgs<bf16>&, cudaStream_t);

}  // namespace gpt::kern
