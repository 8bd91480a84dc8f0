// The CPU backend: the fp32 reference every other backend is tested against. OpenMP over rows,
// OpenBLAS for matrix products. Reductions are written so that results do not depend on the
// number of threads' finishing order (fixed partitions, summed in order).
#include <cblas.h>
#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/fp8_cpu.hpp"
#include "backend/cpu/gelu.hpp"
#include "backend/cpu/xent.hpp"
#include "backend/op_tally.hpp"
#include "base/activation.hpp"
#include "base/random.hpp"
#include "base/rope.hpp"

namespace gpt {
namespace {
using cpu::gelu;
using cpu::gelu_grad;

// Runs fn(lo, hi) on a fixed share of [0, n) per OpenMP thread. Matrix products are split this way
// over their output rows and each share runs single-threaded BLAS: one thread pool instead of
// OpenMP's and OpenBLAS's competing for the same cores.
template <class Fn>
void split_rows(int n, Fn fn) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int lo = int(int64_t(n) * t / nt), hi = int(int64_t(n) * (t + 1) / nt);
    if (hi > lo) fn(lo, hi);
  }
}

// out (C) = the column sums of x (N, C), each in double over the rows in order.
void column_sums(float* out, const float* x, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int i = 0; i < N; ++i) s += x[size_t(i) * C + c];
    out[c] = float(s);
  }
}

// This process's resident set from /proc/self/status, in bytes: "VmRSS" now, "VmHWM" its peak since
// the last reset_resident_peak(); 0 where the file or the line is missing.
size_t resident_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return size_t(std::strtoull(line.c_str() + prefix.size(), nullptr, 10)) * 1024;
  return 0;
}

// Sets the resident peak back to the resident set now (Linux 4.0 on), so that a sweep's later points in the
// same process measure their own peak, not an earlier point's. The heap an earlier point freed goes back to
// the system first (glibc keeps it resident otherwise, and the next point's buffers would reuse it without
// a page of new resident memory: measured 0).
void reset_resident_peak() {
  malloc_trim(0);
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

class CpuBackend final : public Backend, public Fp8ProductsOwner {
 public:
  explicit CpuBackend(bool op_profile)
      : tally_(op_profile), baseline_((reset_resident_peak(), resident_bytes("VmRSS"))),
        fp8_(make_cpu_fp8_products(*this, tally_)) {
    openblas_set_num_threads(1);
  }
  ~CpuBackend() override {
    for (auto& [p, n] : sizes_) std::free(p);
  }
  std::string name() const override { return "cpu"; }
  std::string hardware() const override { return "cpu: " + std::to_string(omp_get_max_threads()) + " threads"; }
  DType act_dtype() const override { return DType::F32; }
  double peak_flops() const override { return 0; }

  void* alloc(size_t bytes) override {
    size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n);
    if (!p)
      throw Error(kExitOutOfMemory, "out of host memory: could not allocate " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, n);
    std::lock_guard<std::mutex> g(mu_);
    sizes_[p] = n;
    in_use_ += n;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> g(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    in_use_ -= it->second;
    sizes_.erase(it);
    std::free(p);
  }
  void zero(void* p, size_t bytes) override {
    WallScope t(tally_, "zero");
    std::memset(p, 0, bytes);
  }
  void copy_h2d(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy_d2h(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy_d2d(void* d, const void* s, size_t n) override { std::memmove(d, s, n); }
  void synchronize() override { tally_.end_window(); }  // ops are synchronous: only the step's end to mark
  std::string op_profile() const override { return tally_.table(); }
  void op_profile_reset() override { tally_.reset(); }
  void op_profile_pause(bool paused) override { tally_.pause(paused); }
  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes() const override {
    if (const size_t hwm = resident_bytes("VmHWM")) return hwm;  // peak resident set since construction
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return size_t(ru.ru_maxrss) * 1024;  // the process's peak, where /proc has no VmHWM
  }
  void reset_peak() override { peak_in_use_ = in_use_; }
  size_t baseline_bytes() const override { return baseline_; }

  using Backend::add_inplace;
  void convert(const Convert& op) override { std::memmove(op.dst, op.src, op.n * 4); }  // fp32 both ways
  void add_inplace(const AddInplace& op) override {
    WallScope t(tally_, "add_inplace");
    float* d = F(op.dst);
    const float* s = cF(op.src);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < op.n; ++i) d[i] += s[i];
  }

  void encoder_fwd(const EncoderFwd& op) override {
    void* out = op.out;
    const int* tokens = op.tokens;
    const void *wte = op.wte, *wpe = op.wpe;
    const int B = op.B, T = op.T, C = op.C;
    WallScope t(tally_, "encoder_fwd");
    float* o = F(out);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; ++bt) {
      const int t = bt % T;
      const float* we = cF(wte) + size_t(tokens[bt]) * C;
      if (!wpe) {  // no position embedding
        for (int c = 0; c < C; ++c) o[size_t(bt) * C + c] = we[c];
        continue;
      }
      const float* pe = cF(wpe) + size_t(t) * C;
      for (int c = 0; c < C; ++c) o[size_t(bt) * C + c] = we[c] + pe[c];
    }
  }
  void encoder_bwd(const EncoderBwd& op) override {
    void *dwte = op.dwte, *dwpe = op.dwpe;
    const void* dout = op.dout;
    const int* tokens = op.tokens;
    const int B = op.B, T = op.T, C = op.C;
    WallScope t(tally_, "encoder_bwd");
    float *gw = F(dwte), *gp = F(dwpe);
    const float* d = cF(dout);
    // each thread owns a slice of channels: no two threads touch one address, order is fixed
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c) {
      for (int bt = 0; bt < B * T; ++bt) {
        const float g = d[size_t(bt) * C + c];
        gw[size_t(tokens[bt]) * C + c] += g;
        if (gp) gp[size_t(bt % T) * C + c] += g;
      }
    }
  }
  void norm_fwd(const NormFwd& op) override {
    const bool rms = op.kind == NormKind::rmsnorm;
    WallScope t(tally_, op.q.data ? (rms ? "rmsnorm_fwd_fp8" : "layernorm_fwd_fp8")
                        : op.b ? (rms ? "residual_rmsnorm_fwd" : "residual_layernorm_fwd")
                               : (rms ? "rmsnorm_fwd" : "layernorm_fwd"));
    const int N = op.N, C = op.C;
    const float* x = cF(op.a);
    if (op.b) {
      float* r = F(op.residual);
      const float* y = cF(op.b);
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < size_t(N) * C; ++i) r[i] = x[i] + y[i];
      x = r;
    }
    float* o = F(op.out);
    if (op.q.data) {  // y in fp32 first, then the FP8 ops' cast of it
      norm_out_.resize(size_t(N) * C);
      o = norm_out_.data();
    }
    const float *wt = cF(op.w), *bs = cF(op.bias);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
      const float* xi = x + size_t(i) * C;
      double m = 0;
      if (!rms) {
        for (int c = 0; c < C; ++c) m += xi[c];
        m /= C;
      }
      double v = 0;
      for (int c = 0; c < C; ++c) v += (xi[c] - m) * (xi[c] - m);
      v /= C;
      const float s = float(1.0 / std::sqrt(v + 1e-5));
      if (rms)
        for (int c = 0; c < C; ++c) o[size_t(i) * C + c] = float(double(xi[c]) * s) * wt[c];
      else if (bs)
        for (int c = 0; c < C; ++c) o[size_t(i) * C + c] = float((xi[c] - m) * s) * wt[c] + bs[c];
      else  // model.bias false
        for (int c = 0; c < C; ++c) o[size_t(i) * C + c] = float((xi[c] - m) * s) * wt[c];
      if (op.mean) op.mean[i] = float(m);
      op.rstd[i] = s;
    }
    if (op.q.data) {
      Fp8Cast cast;
      cast.q = op.q, cast.x = o, cast.N = N, cast.C = C;
      fp8_cast(cast);
    }
  }
  void norm_bwd(const NormBwd& op) override {
    const bool rms = op.kind == NormKind::rmsnorm;
    WallScope t(tally_, rms ? "rmsnorm_bwd" : "layernorm_bwd");
    const int N = op.N, C = op.C;
    const float *g = cF(op.dout), *x = cF(op.inp), *wt = cF(op.w);
    // RMSNorm is LayerNorm's backward with the mean taken as 0 (x - 0 is x, exactly) and no bias
    if (rms) norm_zeros_.assign(size_t(N), 0.0f);
    const float *mean = rms ? norm_zeros_.data() : op.mean, *rstd = op.rstd;
    float* dx = F(op.dinp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
      const float* gi = g + size_t(i) * C;
      const float* xi = x + size_t(i) * C;
      double dmean = 0, dnorm_mean = 0;
      for (int c = 0; c < C; ++c) {
        const float norm = (xi[c] - mean[i]) * rstd[i];
        const float dn = gi[c] * wt[c];
        dmean += dn;
        dnorm_mean += dn * norm;
      }
      dmean = rms ? 0.0 : dmean / C;
      dnorm_mean /= C;
      for (int c = 0; c < C; ++c) {
        const float norm = (xi[c] - mean[i]) * rstd[i];
        const float dn = gi[c] * wt[c];
        dx[size_t(i) * C + c] += float((dn - dmean - norm * dnorm_mean) * rstd[i]);
      }
    }
    float *gw = F(op.dw), *gb = F(op.db);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c) {
      double sw = 0, sb = 0;
      for (int i = 0; i < N; ++i) {
        const float norm = (x[size_t(i) * C + c] - mean[i]) * rstd[i];
        sw += g[size_t(i) * C + c] * norm;
        sb += g[size_t(i) * C + c];
      }
      gw[c] += float(sw);
      if (gb) gb[c] += float(sb);
    }
    if (op.dinp_colsum) column_sums(op.dinp_colsum, dx, N, C);
  }
  using Backend::matmul_fwd;
  using Backend::matmul_bwd;
  void matmul_fwd(const MatmulFwd& op) override {
    if (matmul_fwd_unfused(*this, op)) return;
    if (!fp8_matmul_fwd(fp8_.get(), op)) values_fwd(op.out, op.inp.x, op.w.x, op.bias, op.N, op.IC, op.OC, op.pre_gelu);
  }
  void matmul_bwd(const MatmulBwd& op) override {
    if (matmul_bwd_unfused(*this, op)) return;
    if (!fp8_matmul_bwd(fp8_.get(), op))
      values_bwd(op.dinp, op.dw, op.dbias, op.dout.x, op.inp.x, op.w.x, op.N, op.IC, op.OC, op.pre_gelu, op.dout_colsum);
  }
  void values_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC, void* pre_gelu) {
    WallScope t(tally_, tally_.enabled() ? matmul_op_name("matmul_fwd", IC, OC, pre_gelu ? " +gelu" : "") : "");
    float* dst = pre_gelu ? F(pre_gelu) : F(out);
    split_rows(N, [&](int lo, int hi) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, OC, IC, 1.0f, cF(inp) + size_t(lo) * IC, IC, cF(w),
                  IC, 0.0f, dst + size_t(lo) * OC, OC);
    });
    if (bias) {
      const float* bs = cF(bias);
#pragma omp parallel for schedule(static)
      for (int i = 0; i < N; ++i)
        for (int o = 0; o < OC; ++o) dst[size_t(i) * OC + o] += bs[o];
    }
    if (pre_gelu) activation_fwd(ActivationFwd{out, pre_gelu, size_t(N) * OC, Activation::gelu});
  }
  void values_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, int N, int IC,
                  int OC, const void* pre_gelu, const float* dout_colsum) {
    WallScope t(tally_, tally_.enabled() ? matmul_op_name("matmul_bwd", IC, OC, pre_gelu ? " +dgelu" : "") : "");
    if (dinp) {
      float* dx = F(dinp);
      split_rows(N, [&](int lo, int hi) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, IC, OC, 1.0f, cF(dout) + size_t(lo) * OC, OC,
                    cF(w), IC, 0.0f, dx + size_t(lo) * IC, IC);
      });
      if (pre_gelu) activation_bwd(ActivationBwd{dinp, pre_gelu, size_t(N) * IC, Activation::gelu});
    }
    if (dw)
      split_rows(OC, [&](int lo, int hi) {  // dw rows [lo, hi) = dout[:, lo:hi]^T @ inp
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, IC, N, 1.0f, cF(dout) + lo, OC, cF(inp), IC, 1.0f,
                    F(dw) + size_t(lo) * IC, IC);
      });
    if (dbias) {
      std::vector<float> sums;
      if (!dout_colsum) {
        sums.resize(OC);
        column_sums(sums.data(), cF(dout), N, OC);
      }
      const float* s = dout_colsum ? dout_colsum : sums.data();
      float* gb = F(dbias);
      for (int o = 0; o < OC; ++o) gb[o] += s[o];
    }
  }
  void rope(const Rope& op) override {
    WallScope t(tally_, op.inverse ? "rope_bwd" : "rope_fwd");
    const int T = op.T, NH = op.NH, HS = op.HS, half = HS / 2;
    float* qkv = F(op.qkv);
    // each angle once per position, for every sequence of the batch and every head of q and k
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < half; ++i) {
        const RopeAngle r = rope_angle(t, i, HS, op.inverse);
        for (int b = 0; b < op.B; ++b)
          for (int h = 0; h < 2 * NH; ++h) {  // q's heads, then k's
            float* v = qkv + ((size_t(b) * T + t) * 3 * NH + h) * HS;
            rope_rotate(v[i], v[i + half], r);
          }
      }
  }
  void attention_fwd(const AttentionFwd& op) override {
    void* out = op.out;
    float* lse = op.lse;
    const void* qkv = op.qkv;
    const int B = op.B, T = op.T, NH = op.NH, HS = op.HS;
    WallScope t(tally_, "attention_fwd");
    const float* q = cF(qkv);
    float* o = F(out);
    const size_t C = size_t(NH) * HS, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel
    {
      std::vector<float> s(T);
#pragma omp for schedule(static) collapse(2)
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
          for (int t = 0; t < T; ++t) {
            const float* qt = q + (size_t(b) * T + t) * C3 + size_t(h) * HS;
            float mx = -INFINITY;
            for (int j = 0; j <= t; ++j) {
              const float* kj = q + (size_t(b) * T + j) * C3 + C + size_t(h) * HS;
              float d = 0;
              for (int i = 0; i < HS; ++i) d += qt[i] * kj[i];
              s[j] = d * scale;
              mx = std::max(mx, s[j]);
            }
            double sum = 0;
            for (int j = 0; j <= t; ++j) sum += std::exp(double(s[j] - mx));
            const float l = mx + float(std::log(sum));
            lse[(size_t(b) * NH + h) * T + t] = l;
            float* ot = o + (size_t(b) * T + t) * C + size_t(h) * HS;
            for (int i = 0; i < HS; ++i) ot[i] = 0;
            for (int j = 0; j <= t; ++j) {
              const float p = std::exp(s[j] - l);
              const float* vj = q + (size_t(b) * T + j) * C3 + 2 * C + size_t(h) * HS;
              for (int i = 0; i < HS; ++i) ot[i] += p * vj[i];
            }
          }
    }
  }
  void attention_bwd(const AttentionBwd& op) override {
    void* dqkv = op.dqkv;
    const void *dout = op.dout, *qkv = op.qkv, *out = op.out;
    const float* lse = op.lse;
    const int B = op.B, T = op.T, NH = op.NH, HS = op.HS;
    WallScope t(tally_, "attention_bwd");
    const float *q = cF(qkv), *g = cF(dout), *o = cF(out);
    float* dq = F(dqkv);
    const size_t C = size_t(NH) * HS, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    std::memset(dq, 0, sizeof(float) * size_t(B) * T * C3);
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < T; ++t) {
          const float* qt = q + (size_t(b) * T + t) * C3 + size_t(h) * HS;
          const float* gt = g + (size_t(b) * T + t) * C + size_t(h) * HS;
          const float* ot = o + (size_t(b) * T + t) * C + size_t(h) * HS;
          float* dqt = dq + (size_t(b) * T + t) * C3 + size_t(h) * HS;
          const float l = lse[(size_t(b) * NH + h) * T + t];
          float D = 0;
          for (int i = 0; i < HS; ++i) D += gt[i] * ot[i];
          for (int j = 0; j <= t; ++j) {
            const float* kj = q + (size_t(b) * T + j) * C3 + C + size_t(h) * HS;
            const float* vj = kj + C;
            float* dkj = dq + (size_t(b) * T + j) * C3 + C + size_t(h) * HS;
            float* dvj = dkj + C;
            float sdot = 0, dp = 0;
            for (int i = 0; i < HS; ++i) {
              sdot += qt[i] * kj[i];
              dp += gt[i] * vj[i];
            }
            const float p = std::exp(sdot * scale - l);
            const float ds = p * (dp - D) * scale;
            for (int i = 0; i < HS; ++i) {
              dqt[i] += ds * kj[i];
              dkj[i] += ds * qt[i];
              dvj[i] += p * gt[i];
            }
          }
        }
  }
  // fn(value, derivative) of activation `act` on values (GELU in its tanh form): the one place a new
  // activation is dispatched here
  template <class Fn>
  static void with_activation(Activation act, Fn fn) {
    if (act == Activation::relu2)
      fn([](float x) { return relu2(x); }, [](float x) { return relu2_grad(x); });
    else
      fn([](float x) { return gelu(x); }, [](float x) { return gelu_grad(x); });
  }
  void activation_fwd(const ActivationFwd& op) override {
    WallScope t(tally_, activation_op_names(op.act).fwd);
    float* o = F(op.out);
    const float* x = cF(op.inp);
    with_activation(op.act, [&](auto f, auto) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < op.n; ++i) o[i] = f(x[i]);
    });
  }
  void activation_bwd(const ActivationBwd& op) override {
    WallScope t(tally_, activation_op_names(op.act).bwd);
    float* d = F(op.d);
    const float* x = cF(op.pre);
    with_activation(op.act, [&](auto, auto grad) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < op.n; ++i) d[i] *= grad(x[i]);
    });
  }
  using Backend::classifier;
  void classifier(const ClassifierLoss& op) override {
    if (!fp8_classifier(fp8_.get(), op)) values_loss(op.logits, op.losses, op.targets, op.N, op.V, op.Vp, op.dloss);
  }
  void values_loss(void* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss) {
    WallScope t(tally_, "classifier");
    float* z = F(logits);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
      float* zi = z + size_t(i) * Vp;
      losses[i] = cpu::xent_row(zi, dloss != 0.0f ? zi : nullptr, V, Vp, targets[i], dloss);
    }
  }
  void normal_init(const NormalInit& op) override {
    WallScope t(tally_, "normal_init");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < op.n; ++i) op.dst[i] = float(normal_init_value(op.seed, op.index + i, op.std));
  }
  double sum_squares(const SumSquares& op) override {
    WallScope t(tally_, "sum_squares");
    const float* v = cF(op.x);
    const size_t n = op.n;
    const int parts = 64;  // fixed partition: the sum does not depend on the thread count
    double partial[parts];
#pragma omp parallel for schedule(static)
    for (int p = 0; p < parts; ++p) {
      const size_t lo = n * p / parts, hi = n * (p + 1) / parts;
      double s = 0;
      for (size_t i = lo; i < hi; ++i) s += double(v[i]) * v[i];
      partial[p] = s;
    }
    double s = 0;
    for (int p = 0; p < parts; ++p) s += partial[p];
    if (!op.out) return s;
    *op.out = s;  // the CPU's memory: queued and done alike
    return 0;
  }
  std::string supports_fp8() const override { return ""; }  // emulated
  Fp8Products* fp8_products() override { return fp8_.get(); }
  void fp8_cast(const Fp8Cast& op) override { gpt::fp8_cast(fp8_.get(), op); }
  void fp8_quantize(const Fp8Quantize& op) override { fp8_products_of(fp8_.get()).quantize(op); }
  void fp8_transpose(const Fp8Transpose& op) override { fp8_products_of(fp8_.get()).transpose(op); }
  void fp8_update_scales(const Fp8UpdateScales& op) override { fp8_products_of(fp8_.get()).update_scales(op); }
  void run_op(const char* name, const std::function<void(void*)>& fn) override {
    WallScope t(tally_, name);
    fn(nullptr);
  }

 private:
  static float* F(void* p) { return static_cast<float*>(p); }
  static const float* cF(const void* p) { return static_cast<const float*>(p); }
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  OpTally tally_;
  size_t in_use_ = 0, peak_in_use_ = 0;
  const size_t baseline_;  // resident set before the first allocation: libraries, MPI, earlier sweep points' heap
  std::unique_ptr<Fp8Products> fp8_;
  std::vector<float> norm_out_;    // a norm's output before its FP8 cast
  std::vector<float> norm_zeros_;  // RMSNorm's mean in its backward
};

}  // namespace

DeviceCaps cpu_device_caps() {
  DeviceCaps c;
  c.name = "cpu";
  c.fp8 = c.fp8_emulated = true;
  return c;
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& o) {
  return std::make_unique<CpuBackend>(o.op_profile);
}

}  // namespace gpt
