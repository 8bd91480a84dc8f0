// FP8 on the CPU: the encoding (every code, ties, saturation), the scale rule, the CPU backend's FP8
// ops (cast, transpose, products, the classifier's FP8 gradient, scale update) against direct
// computations, and a whole step with the FP8 classifier against fp32.
//   test_fp8               run the checks
//   test_fp8 --dump DIR    also write DIR/x.f32 (random values) and DIR/q_e4m3.u8, DIR/q_e5m2.u8 (the CPU
//                          backend's casts of x at scale 1), for tests/integration/test_fp8.py's NumPy check
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/fp8_products.hpp"
#include "base/fp8.hpp"
#include "base/gelu_logistic.hpp"
#include "test_util.hpp"
#include "gpt_init.hpp"
#include "model/fp8_scaling.hpp"
#include "model/gpt.hpp"

using namespace gpt;

namespace {

// The FP8 products themselves (Backend::matmul_fwd and matmul_bwd dispatch FP8 operands to them)
Fp8Products& products(Backend& b) { return fp8_products(b); }

const Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};

TEST(Fp8, every_code_decodes_and_encodes_back) {
  for (Fp8Format f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(uint8_t(c), f);
      if (std::isnan(v) || std::isinf(v)) continue;
      EXPECT_TRUE(fp8_encode(v, f) == c) << std::string(fp8_format_name(f)) + " code " + std::to_string(c);
    }
}

TEST(Fp8, midpoints_round_to_the_even_code_and_large_values_saturate) {
  for (Fp8Format f : kFormats) {
    for (int c = 0; c < 0x7a; ++c) {  // positive finite codes with a finite successor
      const float lo = fp8_decode(uint8_t(c), f), hi = fp8_decode(uint8_t(c + 1), f);
      if (std::isnan(hi) || std::isinf(hi)) continue;
      const float mid = 0.5f * (lo + hi);
      EXPECT_TRUE(fp8_encode(mid, f) == ((c % 2 == 0) ? c : c + 1));
      EXPECT_TRUE(fp8_encode(std::nextafter(mid, 0.0f), f) == c);
      EXPECT_TRUE(fp8_encode(-std::nextafter(mid, 1e9f), f) == (0x80 | (c + 1)));
    }
    const int max_code = f == Fp8Format::E4M3 ? 0x7e : 0x7b;
    EXPECT_TRUE(fp8_decode(uint8_t(max_code), f) == fp8::max_finite(f));
    EXPECT_TRUE(fp8_encode(1e30f, f) == max_code);
    EXPECT_TRUE(fp8_encode(-INFINITY, f) == (0x80 | max_code));
    EXPECT_TRUE(fp8_encode(NAN, f) == 0x7f);
  }
}

TEST(Fp8, scales_are_the_largest_power_of_two_that_fits) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> e(-30.0f, 30.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(e(rng)), maxval = i % 2 ? 448.0f : 57344.0f;
    const float s = fp8::scale_for(amax, maxval, 1.0f);
    int ex = 0;
    EXPECT_TRUE(std::frexp(s, &ex) == 0.5f);  // a power of two
    EXPECT_TRUE(amax * s <= maxval);
    EXPECT_TRUE(amax * s * 2.0f > maxval);
  }
  EXPECT_TRUE(fp8::scale_for(0.0f, 448.0f, 8.0f) == 8.0f);
  EXPECT_TRUE(fp8::scale_for(NAN, 448.0f, 8.0f) == 8.0f);
  EXPECT_TRUE(fp8::scale_for(INFINITY, 448.0f, 8.0f) == 8.0f);
}

struct Meta {  // scale, scale_inv, amax in CPU memory
  float v[3];
  explicit Meta(float s) : v{s, 1.0f / s, 0.0f} {}
  Fp8Tensor t(void* data, Fp8Format f) { return {data, v, v + 1, v + 2, f}; }  // CPU: no alignment needed
};

// Which input-gradient products sum fast: every one up to kFastDinpMaxTerms terms under dinp and all (the
// block products' sums, at most 4 x n_embd), none longer (the FP8 classifier's, over the vocabulary), and
// none under forward.
TEST(Fp8, input_gradient_sums_longer_than_the_bound_keep_the_promotion) {
  using fp8::FastAccum;
  for (const int terms : {768, 3072, 6400, fp8::kFastDinpMaxTerms}) {
    EXPECT_FALSE(fp8::fast_dinp(FastAccum::forward, terms));
    EXPECT_TRUE(fp8::fast_dinp(FastAccum::dinp, terms));
    EXPECT_TRUE(fp8::fast_dinp(FastAccum::all, terms));
  }
  for (const int terms : {fp8::kFastDinpMaxTerms + 1, 50304})
    for (const FastAccum f : {FastAccum::forward, FastAccum::dinp, FastAccum::all})
      EXPECT_FALSE(fp8::fast_dinp(f, terms));
}

TEST(Fp8, cast_transpose_and_column_sums) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 24, C = 40;
  std::vector<float> x(size_t(N) * C);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> q(x.size()), qt(x.size()), t2(x.size());
  std::vector<float> sums(C);
  Meta m(4.0f);
  tests::fp8_cast(*be, m.t(q.data(), Fp8Format::E4M3), qt.data(), x.data(), nullptr, sums.data(), N, C);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  EXPECT_TRUE(m.v[2] == amax);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(r) * C + c;
      EXPECT_TRUE(q[i] == fp8_encode(x[i] * 4.0f, Fp8Format::E4M3));
      EXPECT_TRUE(qt[size_t(c) * N + r] == q[i]);
    }
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int r = 0; r < N; ++r) s += x[size_t(r) * C + c];
    EXPECT_NEAR(sums[c], s, 1e-4);
  }
  be->fp8_transpose({t2.data(), q.data(), N, C});
  EXPECT_TRUE(t2 == qt);
}

// n random finite FP8 codes of both formats, both signs
std::vector<uint8_t> random_codes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& c : v) c = uint8_t(rng() % 0x70) | uint8_t(rng() & 0x80);
  return v;
}

// The backend's product descriptors (Backend::matmul_fwd and matmul_bwd) with FP8 operands are the FP8
// products called in a row: the forward with GELU's FP8 output, and the input gradient, weight gradient and
// bias gradient from the column sums; FP8 and value operands in one product, or an FP8 bias gradient without
// the column sums, are internal errors.
TEST(Fp8, product_descriptors_run_fp8_operands_on_the_fp8_products) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 8, IC = 16, OC = 24;
  std::mt19937 rng(5);
  auto a = random_codes(rng, size_t(N) * IC), w = random_codes(rng, size_t(OC) * IC);
  auto d = random_codes(rng, size_t(N) * OC), dt = random_codes(rng, size_t(OC) * N);
  auto wt = random_codes(rng, size_t(IC) * OC), it = random_codes(rng, size_t(IC) * N);
  std::vector<float> bias(OC), sums(OC);
  for (int o = 0; o < OC; ++o) bias[o] = 0.25f * float(o % 5) - 0.5f, sums[o] = 0.125f * float(o % 7) - 0.25f;
  Meta ma(2.0f), mw(0.5f), md(1.0f), m1(4.0f), m2(4.0f);
  const Fp8Tensor ta = ma.t(a.data(), Fp8Format::E4M3), tw = mw.t(w.data(), Fp8Format::E4M3);
  std::vector<float> pre1(size_t(N) * OC), pre2(pre1.size()), scratch(pre1.size());
  std::vector<uint8_t> q1(pre1.size()), q2(pre1.size());
  ASSERT_TRUE(products(*be).matmul_fwd_gelu_q(m1.t(q1.data(), Fp8Format::E4M3), ta, tw, bias.data(), N, IC, OC,
                                              pre1.data()));
  MatmulFwd f;
  f.out = scratch.data(), f.out_q = m2.t(q2.data(), Fp8Format::E4M3), f.inp = fp8_bytes(ta), f.w = fp8_bytes(tw);
  f.bias = bias.data(), f.pre_gelu = pre2.data(), f.N = N, f.IC = IC, f.OC = OC;
  be->matmul_fwd(f);
  EXPECT_TRUE(q1 == q2);
  EXPECT_TRUE(pre1 == pre2);
  EXPECT_EQ(m1.v[2], m2.v[2]);
  const Fp8Tensor td = md.t(d.data(), Fp8Format::E5M2), tdt = md.t(dt.data(), Fp8Format::E5M2);
  const Fp8Tensor twt = mw.t(wt.data(), Fp8Format::E4M3), tit = ma.t(it.data(), Fp8Format::E4M3);
  std::vector<float> di1(size_t(N) * IC), di2(di1.size()), dw1(size_t(OC) * IC, 1.0f), dw2(dw1), db1(OC, 0.5f), db2(db1);
  products(*be).matmul_dinp(di1.data(), td, twt, N, IC, OC, nullptr);
  products(*be).matmul_dw(dw1.data(), tdt, tit, N, IC, OC);
  products(*be).add_sums(db1.data(), sums.data(), OC);
  MatmulBwd b;
  b.dinp = di2.data(), b.dw = dw2.data(), b.dbias = db2.data(), b.dout = fp8_bytes(td), b.w = fp8_bytes(twt);
  b.dout_t = tdt, b.inp = fp8_bytes(tit), b.dout_colsum = sums.data(), b.N = N, b.IC = IC, b.OC = OC;
  be->matmul_bwd(b);
  EXPECT_TRUE(di1 == di2);
  EXPECT_TRUE(dw1 == dw2);
  EXPECT_TRUE(db1 == db2);
  std::vector<float> wf(size_t(OC) * IC, 0.5f);
  MatmulFwd mixed = f;
  mixed.w = values(wf.data());
  EXPECT_THROW(be->matmul_fwd(mixed), Error);
  MatmulBwd no_sums = b;
  no_sums.dout_colsum = nullptr;
  EXPECT_THROW(be->matmul_bwd(no_sums), Error);
}

// GELU's output in FP8 from the forward product is the product, then GELU (base/gelu_logistic.hpp) and the
// cast: the same bytes, the same pre-activation and the same amax (the model's fc output takes either path)
TEST(Fp8, gelu_output_in_fp8_is_the_product_then_the_cast_or_gelu_in_the_cast) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 8, IC = 16, OC = 24;
  std::mt19937 rng(11);
  auto a = random_codes(rng, size_t(N) * IC), w = random_codes(rng, size_t(OC) * IC);
  std::vector<float> bias(OC);
  for (int o = 0; o < OC; ++o) bias[o] = 0.25f * float(o % 5) - 0.5f;
  Meta ma(2.0f), mw(0.5f), m1(4.0f), m2(4.0f);
  const Fp8Tensor ta = ma.t(a.data(), Fp8Format::E4M3), tw = mw.t(w.data(), Fp8Format::E4M3);
  std::vector<float> gelu(size_t(N) * OC), pre1(gelu.size()), pre2(gelu.size());
  std::vector<uint8_t> q1(gelu.size()), q2(gelu.size());
  products(*be).matmul_fwd(pre1.data(), ta, tw, bias.data(), N, IC, OC, nullptr);
  for (size_t i = 0; i < gelu.size(); ++i) gelu[i] = gelu_logistic(pre1[i]);
  tests::fp8_cast(*be, m1.t(q1.data(), Fp8Format::E4M3), nullptr, gelu.data(), nullptr, nullptr, N, OC);
  ASSERT_TRUE(products(*be).matmul_fwd_gelu_q(m2.t(q2.data(), Fp8Format::E4M3), ta, tw, bias.data(), N, IC, OC,
                                           pre2.data()));
  EXPECT_TRUE(q1 == q2);
  EXPECT_TRUE(pre1 == pre2);
  EXPECT_GT(m1.v[2], 0.0f);
  EXPECT_EQ(m1.v[2], m2.v[2]);
  // GELU applied in the cast of the product's output before it (what fcproj's input cast does), row-major
  // and transposed: the same bytes and amax
  Meta m3(4.0f);
  std::vector<uint8_t> q3(gelu.size()), q3t(gelu.size());
  tests::fp8_cast_act(*be, m3.t(q3.data(), Fp8Format::E4M3), q3t.data(), pre1.data(), N, OC);
  EXPECT_TRUE(q3 == q1);
  EXPECT_EQ(m3.v[2], m1.v[2]);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < OC; ++c) EXPECT_TRUE(q3t[size_t(c) * N + r] == q1[size_t(r) * OC + c]);
}

// GELU in the FP8 casts (base/gelu_logistic.hpp) keeps its relative accuracy in the negative tail, where the
// tanh form's 1 + tanh(u) cancels, so both backends quantize the true value there rather than their own
// rounding noise
TEST(Fp8, gelu_in_the_casts_is_accurate_in_the_negative_tail) {
  const double k = std::sqrt(2.0 / M_PI), a = 0.044715;
  auto ref = [&](double x, bool grad) {  // the tanh approximation in double precision, through exp
    const double u = k * (x + a * x * x * x), s = 1.0 / (1.0 + std::exp(-2.0 * u)), es = 1.0 - s;
    return grad ? s * (1.0 + 2.0 * k * x * (1.0 + 3.0 * a * x * x) * es) : x * s;
  };
  double worst = 0;
  for (int i = -1000; i <= 800; ++i) {  // x in [-10, 8]
    const float x = 0.01f * float(i);
    for (bool grad : {false, true}) {
      const double r = ref(x, grad), v = grad ? gelu_logistic_grad(x) : gelu_logistic(x);
      if (std::fabs(r) > 1e-30 && std::fabs(x + 0.7517) > 0.01) worst = std::max(worst, std::fabs(v / r - 1.0));
    }
  }
  EXPECT_LT(worst, 5e-5) << "worst relative error of GELU or its derivative over [-10, 8]";
  // the CPU casts quantize those values: x = 1 times gelu'(-6), and gelu(-6), scaled into E5M2's normal range
  auto be = make_cpu_backend(BackendOptions{});
  const float one = 1.0f, g = -6.0f;
  uint8_t q = 0;
  Meta m(std::ldexp(1.0f, 40));
  tests::fp8_cast(*be, m.t(&q, Fp8Format::E5M2), nullptr, &one, &g, nullptr, 1, 1);
  EXPECT_EQ(q, fp8_encode(float(ref(g, true) * std::ldexp(1.0, 40)), Fp8Format::E5M2));
  tests::fp8_cast_act(*be, m.t(&q, Fp8Format::E5M2), nullptr, &g, 1, 1);
  EXPECT_EQ(q, fp8_encode(float(ref(g, false) * std::ldexp(1.0, 40)), Fp8Format::E5M2));
}

TEST(Fp8, products_use_the_dequantized_operands) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 8, IC = 16, OC = 32;
  std::mt19937 rng(9);
  const auto a = random_codes(rng, size_t(N) * IC), w = random_codes(rng, size_t(OC) * IC);
  Meta ma(2.0f), mw(0.5f);
  std::vector<float> out(size_t(N) * OC), dw(size_t(OC) * IC, 1.0f);
  products(*be).matmul_fwd(out.data(), ma.t(const_cast<uint8_t*>(a.data()), Fp8Format::E4M3),
                        mw.t(const_cast<uint8_t*>(w.data()), Fp8Format::E4M3), nullptr, N, IC, OC, nullptr);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int k = 0; k < IC; ++k)
        s += double(fp8_decode(a[size_t(r) * IC + k], Fp8Format::E4M3)) * 0.5 *
             fp8_decode(w[size_t(o) * IC + k], Fp8Format::E4M3) * 2.0;
      EXPECT_NEAR(out[size_t(r) * OC + o], s, 1e-3 * (1 + std::fabs(s)));
    }
  // dw (OC, IC) += dout_t (OC, N) @ inp_t (IC, N)^T with w's bytes as dout_t (OC x N = 32 x 8 of them)
  const auto dt = random_codes(rng, size_t(OC) * N), it = random_codes(rng, size_t(IC) * N);
  products(*be).matmul_dw(dw.data(), ma.t(const_cast<uint8_t*>(dt.data()), Fp8Format::E5M2),
                       mw.t(const_cast<uint8_t*>(it.data()), Fp8Format::E4M3), N, IC, OC);
  for (int o = 0; o < OC; ++o)
    for (int i = 0; i < IC; ++i) {
      double s = 1.0;
      for (int r = 0; r < N; ++r)
        s += double(fp8_decode(dt[size_t(o) * N + r], Fp8Format::E5M2)) * 0.5 *
             fp8_decode(it[size_t(i) * N + r], Fp8Format::E4M3) * 2.0;
      EXPECT_NEAR(dw[size_t(o) * IC + i], s, 1e-3 * (1 + std::fabs(s)));
    }
}

TEST(Fp8, scale_update_counts_saturation_and_keeps_the_history) {
  auto be = make_cpu_backend(BackendOptions{});
  const int n = 2, H = 3;
  float amax[n] = {500.0f, 1.0f}, hist[H * n] = {0, 0, 0, 2.0f, 0, 0}, scale[n] = {1.0f, 1.0f};
  float inv[n * fp8::kScaleInvStride] = {};
  const float maxval[n] = {448.0f, 448.0f};
  unsigned sat = 0;
  Fp8UpdateScales a;
  a.amax = amax, a.history = hist, a.scale = scale, a.scale_inv = inv, a.maxval = maxval, a.saturated = &sat;
  a.n = n, a.H = H, a.row = 0;
  be->fp8_update_scales(a);
  EXPECT_TRUE(sat == 1);                           // 500 at scale 1 exceeded 448
  EXPECT_TRUE(hist[0] == 500.0f && hist[1] == 1.0f);
  EXPECT_TRUE(scale[0] == 0.5f);                   // 448 / 500
  EXPECT_TRUE(scale[1] == 128.0f);                 // the history's 2.0 wins over this step's 1.0: 448 / 2 -> 128
  EXPECT_TRUE(inv[fp8::kScaleInvStride] == 1.0f / 128.0f);
  EXPECT_TRUE(amax[0] == 0.0f && amax[1] == 0.0f);
}

// Softmax + cross-entropy with the gradient in FP8: the loss and the bytes against a double-precision
// loop, the bytes against quantizing Backend::classifier's fp32 gradient (what the op is: the same
// gradient, quantized as it is made), the amax, saturation, padded columns and dloss 0.
TEST(Fp8, classifier_writes_its_gradient_in_fp8) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 13, V = 301, Vp = 384;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> z(size_t(N) * Vp);
  for (auto& v : z) v = nd(rng);
  std::vector<int> tgt(N);
  for (auto& t : tgt) t = int(rng() % V);
  const float dloss = 1.0f / 64;
  for (Fp8Format f : kFormats) {
    // the largest power of two that keeps |g| <= dloss in range, and 8x more: values near dloss saturate
    const float fit = f == Fp8Format::E4M3 ? 16384.0f : 2097152.0f;
    for (float scale : {fit, 8 * fit}) {
      std::vector<uint8_t> q(z.size(), 0xAA);
      std::vector<float> losses(N), zin = z;
      Meta m(scale);
      products(*be).classifier(zin.data(), losses.data(), tgt.data(), N, V, Vp, dloss, m.t(q.data(), f));
      EXPECT_TRUE(zin == z) << "the logits are only read";
      // Backend::classifier on a copy: the same losses, bit for bit, and its gradient quantized
      std::vector<float> g = z, ref_losses(N);
      be->classifier(g.data(), ref_losses.data(), tgt.data(), N, V, Vp, dloss);
      EXPECT_TRUE(losses == ref_losses);
      float amax = 0;
      size_t differ = 0, saturated = 0;
      for (int i = 0; i < N; ++i) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < V; ++j) mx = std::max(mx, double(z[size_t(i) * Vp + j]));
        for (int j = 0; j < V; ++j) sum += std::exp(double(z[size_t(i) * Vp + j]) - mx);
        EXPECT_NEAR(losses[i], mx + std::log(sum) - z[size_t(i) * Vp + tgt[i]], 1e-5);
        for (int j = 0; j < Vp; ++j) {
          const size_t k = size_t(i) * Vp + j;
          EXPECT_EQ(q[k], fp8_encode(g[k] * scale, f)) << "row " << i << " column " << j;
          amax = std::max(amax, std::fabs(g[k]));
          if (j >= V) {
            EXPECT_EQ(q[k], 0) << "padded column " << j;
            continue;
          }
          const double p = std::exp(double(z[k]) - mx) / sum;
          const double want = (p - (j == tgt[i] ? 1.0 : 0.0)) * dloss;
          const uint8_t w = fp8_encode(float(want * scale), f);
          if (q[k] != w) {  // fp32 against double arithmetic: at most the neighbouring code
            ++differ;
            EXPECT_TRUE((q[k] & 0x80) == (w & 0x80) && std::abs(int(q[k] & 0x7f) - int(w & 0x7f)) == 1);
          }
          if (std::fabs(want * scale) > fp8::max_finite(f)) ++saturated;
        }
      }
      EXPECT_TRUE(m.v[2] == amax) << "amax " << m.v[2] << " vs " << amax;
      EXPECT_TRUE(differ * 1000 < size_t(N) * V) << differ << " bytes differ from the double-precision gradient";
      EXPECT_TRUE((scale == fit) == (saturated == 0)) << saturated << " values beyond the format at scale " << scale;
    }
  }
  // dloss 0 (evaluation through the FP8 op): the losses, and a gradient of zeros
  std::vector<uint8_t> q(z.size(), 0xAA);
  std::vector<float> losses(N), ref(N), zc = z;
  Meta m(1.0f);
  products(*be).classifier(z.data(), losses.data(), tgt.data(), N, V, Vp, 0.0f, m.t(q.data(), Fp8Format::E5M2));
  be->classifier(zc.data(), ref.data(), tgt.data(), N, V, Vp, 0.0f);
  EXPECT_TRUE(losses == ref);
  EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](uint8_t b) { return b == 0; }) && m.v[2] == 0.0f);
  // the backend's loss with the FP8 gradient as a field (ClassifierLoss::dlogits): the FP8 op's bytes
  std::vector<uint8_t> q1(z.size()), q2(z.size());
  std::vector<float> l1(N), l2(N);
  Meta m1(1.0f), m2(1.0f);
  products(*be).classifier(z.data(), l1.data(), tgt.data(), N, V, Vp, 0.5f, m1.t(q1.data(), Fp8Format::E5M2));
  ClassifierLoss op;
  op.logits = z.data(), op.losses = l2.data(), op.targets = tgt.data(), op.N = N, op.V = V, op.Vp = Vp, op.dloss = 0.5f;
  op.dlogits = m2.t(q2.data(), Fp8Format::E5M2);
  be->classifier(op);
  EXPECT_TRUE(l1 == l2 && q1 == q2 && m1.v[2] == m2.v[2] && m1.v[2] > 0.0f);
}

// Parameters and gradients in host memory (the CPU backend's), no sharding; parameters never change.
struct HostStore : ParamStore {
  std::vector<std::vector<float>> p, g;
  HostStore(const ParamLayout& L, const std::vector<std::vector<float>>& init) : p(init) {
    for (int k = 0; k < L.n_buckets(); ++k) g.emplace_back(L.bucket(k).size, 0.0f);
  }
  void zero_grads() {
    for (auto& x : g) std::fill(x.begin(), x.end(), 0.0f);
  }
  const void* params(int b) override { return p[b].data(); }
  void* grads(int b) override { return g[b].data(); }
};

double rel_l2(const float* a, const float* b, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(a[i]) * a[i];
  }
  return std::sqrt(e / std::max(r, 1e-30));
}

// One training step of a 2-layer model with the classifier in FP8 (alone, and with the block products),
// after the trainer's two calibration passes, against the same step in fp32; the batch is 8320 rows, so
// the classifier runs in two chunks (8192 + 128). The logits' gradient has 2 mantissa bits (E5M2: each
// value rounded by up to 1/8 of itself, about 5% rms), x and wte 3 (E4M3: up to 1/16). dlnf and dwte are
// sums of products with random signs, so their relative error stays near the gradient's, and dlnf
// carries it into every layer. Measured when this was written (rel L2 to fp32): the classifier alone
// 1-6e-2 for wte and the final LayerNorm, 4-8.5e-2 in the blocks, the loss within 1e-5; with the block
// products too 2.5e-2 to 1.5e-1. The bounds leave about 2x room; a wrong scale or transpose gives ~1.
constexpr double kTolClassifierGrad = 0.2, kTolFp8StepGrad = 0.3, kTolFp8Loss = 1e-2;

TEST(Fp8, fp8_classifier_step_matches_fp32) {
  auto be = make_cpu_backend(BackendOptions{});
  ModelConfig mc;
  mc.n_layer = 2, mc.n_head = 2, mc.n_embd = 32, mc.vocab_size = 500, mc.max_seq_len = 16;
  const ModelDims d = resolve_dims(mc);
  ParamLayout L(d);
  const int B = 520, T = 16;
  std::mt19937_64 rng(31);
  const auto init = gpt::tests::initial_params(L, rng);
  const auto tok = gpt::tests::random_tokens(size_t(B) * T, d.vocab_size, rng);
  const auto tgt = gpt::tests::random_tokens(size_t(B) * T, d.vocab_size, rng);
  const float dloss = 1.0f / (B * T);
  HostStore s32(L, init);
  GPT m32(d, L, *be, B, T, 0);
  const double l32 = m32.forward(s32, tok.data(), tgt.data(), true, dloss);
  m32.backward(s32);
  const double e32 = m32.forward(s32, tok.data(), tgt.data(), false, 0.0f);
  std::vector<float> row32(d.vocab_size);
  m32.logits_row(s32, tok.data(), 8200, row32.data());
  for (bool linear : {false, true}) {
    Fp8Scaling recipe(*be, Fp8Recipe{});
    PrecisionPolicy policy;
    policy.fp8_linear = linear, policy.fp8_classifier = true;
    HostStore s8(L, init);
    GPT m8({d, policy}, L, *be, B, T, 0, &recipe);
    EXPECT_TRUE(recipe.size() == (linear ? 27u : 3u));
    for (int pass = 0; pass < 2; ++pass) {  // the calibration the trainer does
      m8.forward(s8, tok.data(), tgt.data(), true, dloss);
      m8.backward(s8);
      s8.zero_grads();
      recipe.end_step({});
    }
    const double l8 = m8.forward(s8, tok.data(), tgt.data(), true, dloss);
    m8.backward(s8);
    const std::string what = linear ? "block products and classifier in FP8" : "classifier in FP8";
    std::printf("  %s: loss fp32 %.6f fp8 %.6f\n", what.c_str(), l32, l8);
    EXPECT_TRUE(std::fabs(l32 - l8) <= kTolFp8Loss * l32) << what;
    const double tol = linear ? kTolFp8StepGrad : kTolClassifierGrad;
    for (int k = 0; k < L.n_buckets(); ++k)
      for (auto& t : L.bucket(k).tensors) {
        const double rel = rel_l2(s32.g[k].data() + t.offset, s8.g[k].data() + t.offset, t.numel);
        std::printf("  %-36s bucket %d %-9s rel_l2 %.2e\n", what.c_str(), k, t.name, rel);
        EXPECT_TRUE(rel <= tol) << what << ": bucket " << k << " " << t.name << " rel_l2 " << rel;
      }
    // evaluation: the loss, and one row's logits from its 16-row group (the second chunk's rows)
    const double e8 = m8.forward(s8, tok.data(), tgt.data(), false, 0.0f);
    EXPECT_TRUE(std::fabs(e32 - e8) <= kTolFp8Loss * e32) << what << ": evaluation loss " << e8 << " vs " << e32;
    std::vector<float> row8(d.vocab_size);
    m8.logits_row(s8, tok.data(), 8200, row8.data());
    EXPECT_TRUE(rel_l2(row32.data(), row8.data(), row8.size()) <= kTolClassifierGrad) << what << ": logits_row";
    double mx = -INFINITY, sum = 0;
    for (float v : row8) mx = std::max(mx, double(v));
    for (float v : row8) sum += std::exp(v - mx);
    EXPECT_NEAR(mx + std::log(sum) - row8[tgt[8200]], m8.token_losses()[8200], 1e-4)
        << what << ": logits_row is not the row the loss was computed from";
  }
}

// Random values over the formats' whole ranges (normals, subnormals, ties, saturation), cast at scale 1.
void dump(const std::string& dir) {
  auto be = make_cpu_backend(BackendOptions{});
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> e(-20.0f, 17.0f), u(-1.0f, 1.0f);
  const int N = 512, C = 64;
  std::vector<float> x(size_t(N) * C);
  for (auto& v : x) v = u(rng) * std::exp2(e(rng));
  for (int i = 0; i < 256; ++i) x[i] = fp8_decode(uint8_t(i), Fp8Format::E4M3);  // exact codes
  for (int i = 0; i < 255; ++i)                                                    // midpoints
    x[256 + i] = 0.5f * (fp8_decode(uint8_t(i), Fp8Format::E5M2) + fp8_decode(uint8_t(i + 1), Fp8Format::E5M2));
  for (auto& v : x)
    if (!std::isfinite(v)) v = 1.0f;
  std::ofstream(dir + "/x.f32", std::ios::binary).write(reinterpret_cast<const char*>(x.data()), 4 * x.size());
  for (Fp8Format f : kFormats) {
    std::vector<uint8_t> q(x.size());
    Meta m(1.0f);
    tests::fp8_cast(*be, m.t(q.data(), f), nullptr, x.data(), nullptr, nullptr, N, C);
    std::ofstream(dir + "/q_" + fp8_format_name(f) + ".u8", std::ios::binary)
        .write(reinterpret_cast<const char*>(q.data()), q.size());
  }
}

}  // namespace

// The scaling state by name: a checkpoint without some tensors (a model that scales more than the one
// that wrote it) leaves those uncalibrated; a calibration step then derives their scales alone.
TEST(Fp8, scaling_state_by_name_loads_partial_checkpoints) {
  auto be = make_cpu_backend(BackendOptions{});
  Fp8Recipe r;
  r.history = 2;
  Fp8Scaling old_model(*be, r);
  const int a = old_model.add("h0.qkv.input", Fp8Format::E4M3), b = old_model.add("h0.qkv.grad", Fp8Format::E5M2);
  EXPECT_TRUE(a == 0 && b == 1 && old_model.add("h0.qkv.input", Fp8Format::E4M3) == 0);  // again: the same slot
  *old_model.tensor(a, nullptr).amax = 3.0f;
  *old_model.tensor(b, nullptr).amax = 1e-3f;
  old_model.end_step({});
  const Fp8Scaling::State saved = old_model.state();
  EXPECT_TRUE(saved.steps == 1 && saved.names.size() == 2);
  EXPECT_TRUE(saved.scale[0] == fp8::scale_for(3.0f, 448.0f, 1.0f));

  Fp8Scaling now(*be, r);  // one more scaled tensor, registered between the old ones
  now.add("h0.qkv.input", Fp8Format::E4M3);
  const int fresh = now.add("h0.attn.input", Fp8Format::E4M3);
  now.add("h0.qkv.grad", Fp8Format::E5M2);
  now.add("h0.gone", Fp8Format::E4M3);  // and the checkpoint has nothing for this one either
  const std::vector<std::string> unused = now.set_state(saved);
  EXPECT_TRUE(unused.empty());
  EXPECT_TRUE(!now.calibrated() && now.steps() == 1);
  EXPECT_TRUE(*now.tensor(0, nullptr).scale == saved.scale[0] && *now.tensor(2, nullptr).scale == saved.scale[1]);
  EXPECT_TRUE(*now.tensor(fresh, nullptr).scale == 1.0f);
  // a calibration pass measures every tensor, but only the new ones keep what it learnt
  for (int i = 0; i < 4; ++i) *now.tensor(i, nullptr).amax = 100.0f;
  now.end_calibration_step({});
  now.calibration_done();
  EXPECT_TRUE(now.calibrated() && now.steps() == 1);
  EXPECT_TRUE(*now.tensor(0, nullptr).scale == saved.scale[0] && *now.tensor(2, nullptr).scale == saved.scale[1]);
  EXPECT_TRUE(*now.tensor(fresh, nullptr).scale == fp8::scale_for(100.0f, 448.0f, 1.0f));
  // entries this model has no tensor for are named, and a history of another length is refused
  Fp8Scaling smaller(*be, r);
  smaller.add("h0.qkv.input", Fp8Format::E4M3);
  EXPECT_TRUE(smaller.set_state(saved) == std::vector<std::string>({"h0.qkv.grad"}));
  Fp8Recipe r3 = r;
  r3.history = 3;
  Fp8Scaling other(*be, r3);
  other.add("h0.qkv.input", Fp8Format::E4M3);
  EXPECT_THROW_WITH(other.set_state(saved), "training.fp8_amax_history is 3");
}

TEST(Fp8, scale_margin_leaves_headroom) {
  EXPECT_TRUE(fp8::scale_for(3.0f, 448.0f, 1.0f, 2) == fp8::scale_for(3.0f, 448.0f, 1.0f) / 4.0f);
  EXPECT_TRUE(fp8::scale_for(0.0f, 448.0f, 0.5f, 2) == 0.5f);  // nothing measured: the old scale
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--dump") {
    dump(argv[2]);
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
