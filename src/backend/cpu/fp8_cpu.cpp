#include "backend/cpu/fp8_cpu.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "backend/cpu/gelu.hpp"
#include "backend/cpu/xent.hpp"
#include "base/activation.hpp"

namespace gpt {
namespace {

// fp32 values of an FP8 tensor of n elements
void dequantize(std::vector<float>& out, const Fp8Tensor& t, size_t n) {
  out.resize(n);
  const uint8_t* q = static_cast<const uint8_t*>(t.data);
  const float s = *t.scale_inv;
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = fp8_decode(uint8_t(c), t.fmt) * s;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = table[q[i]];
}

void fold_amax(float* amax, float m) {
  if (amax && (std::isnan(m) || m > *amax)) *amax = m;
}

class CpuFp8Products final : public Fp8Products {
 public:
  CpuFp8Products(Backend& be, OpTally& tally) : be_(be), tally_(tally) {}

  void cast(const Fp8Cast& op) override {
    WallScope t(tally_, fp8_cast_op_name(op));
    const float* x = static_cast<const float*>(op.x);
    if (op.apply == Fp8Cast::Apply::act) {
      act_.resize(size_t(op.N) * op.C);
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < act_.size(); ++i) act_[i] = activation_cast(op.act, x[i]);
      x = act_.data();
    }
    quantize(op.q, op.q_t, x, static_cast<const float*>(op.act_in), op.act, op.colsum, op.N, op.C);
  }
  void quantize(const Fp8Quantize& op) override {
    WallScope t(tally_, "fp8_cast");
    if (op.n > size_t(INT_MAX)) throw Error(kExitFailure, "internal error: an FP8 quantize of more than 2^31 elements");
    quantize(op.q, nullptr, static_cast<const float*>(op.x), nullptr, Activation::gelu, nullptr, 1, int(op.n));
  }
  void transpose(const Fp8Transpose& op) override {
    WallScope t(tally_, "fp8_transpose");
    const uint8_t* s = static_cast<const uint8_t*>(op.src);
    uint8_t* d = static_cast<uint8_t*>(op.dst);
    const int N = op.N, C = op.C;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < N; ++r) d[size_t(c) * N + r] = s[size_t(r) * C + c];
  }
  void matmul_fwd(void* out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias, int N, int IC, int OC,
                  void* pre_gelu) override {
    WallScope t(tally_, tally_.enabled() ? matmul_op_name("matmul_fp8_fwd", IC, OC, pre_gelu ? " +gelu" : "") : "");
    dequantize(a_, inp, size_t(N) * IC);
    dequantize(b_, w, size_t(OC) * IC);
    be_.matmul_fwd(out, a_.data(), b_.data(), bias, N, IC, OC, pre_gelu);
  }
  // the product in fp32 into pre_gelu, then GELU's cast: the same bytes as the cast of GELU's input
  // (training.fp8_gelu_epilogue false, recomputation)
  bool matmul_fwd_gelu_q(const Fp8Tensor& out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias, int N,
                         int IC, int OC, void* pre_gelu) override {
    matmul_fwd(pre_gelu, inp, w, bias, N, IC, OC, nullptr);
    Fp8Cast gelu;
    gelu.q = out, gelu.x = pre_gelu, gelu.apply = Fp8Cast::Apply::act, gelu.N = N, gelu.C = OC;
    cast(gelu);
    return true;
  }
  void matmul_dinp(void* dinp, const Fp8Tensor& dout, const Fp8Tensor& w_t, int N, int IC, int OC,
                   const void* pre_gelu) override {
    WallScope t(tally_, tally_.enabled() ? matmul_op_name("matmul_fp8_dinp", IC, OC, pre_gelu ? " +dgelu" : "") : "");
    dequantize(a_, dout, size_t(N) * OC);
    dequantize(b_, w_t, size_t(IC) * OC);
    float* d = static_cast<float*>(dinp);
    rows([&](int lo, int hi) {  // dinp = dout @ w_t^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, IC, OC, 1.0f, a_.data() + size_t(lo) * OC, OC,
                  b_.data(), OC, 0.0f, d + size_t(lo) * IC, IC);
      if (pre_gelu)
        for (size_t i = size_t(lo) * IC; i < size_t(hi) * IC; ++i)
          d[i] *= cpu::gelu_grad(static_cast<const float*>(pre_gelu)[i]);
    }, N);
  }
  void matmul_dw(void* dw, const Fp8Tensor& dout_t, const Fp8Tensor& inp_t, int N, int IC, int OC) override {
    WallScope t(tally_, tally_.enabled() ? matmul_op_name("matmul_fp8_dw", IC, OC, "") : "");
    dequantize(a_, dout_t, size_t(OC) * N);
    dequantize(b_, inp_t, size_t(IC) * N);
    float* d = static_cast<float*>(dw);
    rows([&](int lo, int hi) {  // dw += dout_t @ inp_t^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, IC, N, 1.0f, a_.data() + size_t(lo) * N, N,
                  b_.data(), N, 1.0f, d + size_t(lo) * IC, IC);
    }, OC);
  }
  void add_sums(void* dst, const float* sums, int n) override {
    float* d = static_cast<float*>(dst);
    for (int i = 0; i < n; ++i) d[i] += sums[i];
  }
  // The CPU backend's classifier row by row (the same arithmetic: losses agree with it bit for bit), the
  // gradient quantized as it is made instead of written over the logits
  void classifier(const void* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                  const Fp8Tensor& dlogits) override {
    WallScope t(tally_, "classifier_fp8");
    const float* z = static_cast<const float*>(logits);
    uint8_t* out = static_cast<uint8_t*>(dlogits.data);
    const float s = *dlogits.scale;
    float amax = 0.0f;
#pragma omp parallel reduction(max : amax)
    {
      std::vector<float> g(Vp);
#pragma omp for schedule(static)
      for (int i = 0; i < N; ++i) {
        losses[i] = cpu::xent_row(z + size_t(i) * Vp, g.data(), V, Vp, targets[i], dloss);
        uint8_t* qi = out + size_t(i) * Vp;
        for (int j = 0; j < Vp; ++j) {
          amax = std::isnan(g[j]) ? INFINITY : std::max(amax, std::fabs(g[j]));
          qi[j] = fp8_encode(g[j] * s, dlogits.fmt);
        }
      }
    }
    fold_amax(dlogits.amax, amax);
  }
  void update_scales(const Fp8UpdateScales& a) override {
    for (int i = 0; i < a.n; ++i) {
      if (a.amax[i] * a.scale[i] > a.maxval[i]) ++*a.saturated;
      a.history[size_t(a.row) * a.n + i] = a.amax[i];
      float m = 0.0f;
      for (int h = 0; h < a.H; ++h) m = std::fmax(m, a.history[size_t(h) * a.n + i]);
      a.scale[i] = fp8::scale_for(m, a.maxval[i], a.scale[i], a.margin);
      a.scale_inv[size_t(i) * fp8::kScaleInvStride] = 1.0f / a.scale[i];
      a.amax[i] = 0.0f;
    }
  }

 private:
  // fn(lo, hi) on a fixed share of [0, n) per thread, each share single-threaded BLAS
  template <class Fn>
  static void rows(Fn fn, int n) {
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int lo = int(int64_t(n) * t / nt), hi = int(int64_t(n) * (t + 1) / nt);
      if (hi > lo) fn(lo, hi);
    }
  }
  // v = x (* act'(g)) -> q.data (N, C) and/or q_t (C, N); amax and column sums of v
  void quantize(const Fp8Tensor& q, void* q_t, const float* x, const float* g, Activation act, float* colsum, int N,
                int C) {
    uint8_t* out = static_cast<uint8_t*>(q.data);
    uint8_t* out_t = static_cast<uint8_t*>(q_t);
    const float s = *q.scale;
    float amax = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : amax)
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) {
        const size_t i = size_t(r) * C + c;
        const float v = g ? x[i] * activation_cast_grad(act, g[i]) : x[i];
        amax = std::isnan(v) ? INFINITY : std::max(amax, std::fabs(v));
        const uint8_t b = fp8_encode(v * s, q.fmt);
        if (out) out[i] = b;
        if (out_t) out_t[size_t(c) * N + r] = b;
      }
    fold_amax(q.amax, amax);
    if (!colsum) return;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c) {
      double sum = 0;
      for (int r = 0; r < N; ++r) {
        const size_t i = size_t(r) * C + c;
        sum += g ? x[i] * activation_cast_grad(act, g[i]) : x[i];
      }
      colsum[c] = float(sum);
    }
  }

  Backend& be_;
  OpTally& tally_;
  std::vector<float> a_, b_, act_;  // dequantized operands; the activation's output before its cast
};

}  // namespace

std::unique_ptr<Fp8Products> make_cpu_fp8_products(Backend& be, OpTally& tally) {
  return std::make_unique<CpuFp8Products>(be, tally);
}

}  // namespace gpt
