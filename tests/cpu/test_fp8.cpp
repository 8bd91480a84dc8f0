// FP8 on the CPU: the encoding (every code, ties, saturation), the scale rule, and the CPU backend's FP8
// ops (cast, transpose, products, scale update) against direct computations.
//   test_fp8               run the checks
//   test_fp8 --dump DIR    also write DIR/x.f32 (random values) and DIR/q_e4m3.u8, DIR/q_e5m2.u8 (the CPU
//                          backend's casts of x at scale 1), for tests/integration/test_fp8.py's NumPy check
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "base/fp8.hpp"
#include "check.hpp"

using namespace gpt;

namespace {

const Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};

TEST(every_code_decodes_and_encodes_back) {
  for (Fp8Format f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(uint8_t(c), f);
      if (std::isnan(v) || std::isinf(v)) continue;
      CHECK_MSG(fp8_encode(v, f) == c, std::string(fp8_format_name(f)) + " code " + std::to_string(c));
    }
}

TEST(midpoints_round_to_the_even_code_and_large_values_saturate) {
  for (Fp8Format f : kFormats) {
    for (int c = 0; c < 0x7a; ++c) {  // positive finite codes with a finite successor
      const float lo = fp8_decode(uint8_t(c), f), hi = fp8_decode(uint8_t(c + 1), f);
      if (std::isnan(hi) || std::isinf(hi)) continue;
      const float mid = 0.5f * (lo + hi);
      CHECK(fp8_encode(mid, f) == ((c % 2 == 0) ? c : c + 1));
      CHECK(fp8_encode(std::nextafter(mid, 0.0f), f) == c);
      CHECK(fp8_encode(-std::nextafter(mid, 1e9f), f) == (0x80 | (c + 1)));
    }
    const int max_code = f == Fp8Format::E4M3 ? 0x7e : 0x7b;
    CHECK(fp8_decode(uint8_t(max_code), f) == fp8::max_finite(f));
    CHECK(fp8_encode(1e30f, f) == max_code);
    CHECK(fp8_encode(-INFINITY, f) == (0x80 | max_code));
    CHECK(fp8_encode(NAN, f) == 0x7f);
  }
}

TEST(scales_are_the_largest_power_of_two_that_fits) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> e(-30.0f, 30.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(e(rng)), maxval = i % 2 ? 448.0f : 57344.0f;
    const float s = fp8::scale_for(amax, maxval, 1.0f);
    int ex = 0;
    CHECK(std::frexp(s, &ex) == 0.5f);  // a power of two
    CHECK(amax * s <= maxval);
    CHECK(amax * s * 2.0f > maxval);
  }
  CHECK(fp8::scale_for(0.0f, 448.0f, 8.0f) == 8.0f);
  CHECK(fp8::scale_for(NAN, 448.0f, 8.0f) == 8.0f);
  CHECK(fp8::scale_for(INFINITY, 448.0f, 8.0f) == 8.0f);
}

struct Meta {  // scale, scale_inv, amax in CPU memory
  float v[3];
  explicit Meta(float s) : v{s, 1.0f / s, 0.0f} {}
  Fp8Tensor t(void* data, Fp8Format f) { return {data, v, v + 1, v + 2, f}; }  // CPU: no alignment needed
};

TEST(cast_transpose_and_column_sums) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 24, C = 40;
  std::vector<float> x(size_t(N) * C);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> q(x.size()), qt(x.size()), t2(x.size());
  std::vector<float> sums(C);
  Meta m(4.0f);
  be->fp8()->cast(m.t(q.data(), Fp8Format::E4M3), qt.data(), x.data(), nullptr, sums.data(), N, C);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  CHECK(m.v[2] == amax);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(r) * C + c;
      CHECK(q[i] == fp8_encode(x[i] * 4.0f, Fp8Format::E4M3));
      CHECK(qt[size_t(c) * N + r] == q[i]);
    }
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int r = 0; r < N; ++r) s += x[size_t(r) * C + c];
    CHECK_NEAR(sums[c], s, 1e-4);
  }
  be->fp8()->transpose(t2.data(), q.data(), N, C);
  CHECK(t2 == qt);
}

TEST(products_use_the_dequantized_operands) {
  auto be = make_cpu_backend(BackendOptions{});
  const int N = 8, IC = 16, OC = 32;
  std::mt19937 rng(9);
  auto codes = [&](size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& c : v) c = uint8_t(rng() % 0x70) | uint8_t(rng() & 0x80);
    return v;
  };
  const auto a = codes(size_t(N) * IC), w = codes(size_t(OC) * IC);
  Meta ma(2.0f), mw(0.5f);
  std::vector<float> out(size_t(N) * OC), dw(size_t(OC) * IC, 1.0f);
  be->fp8()->matmul_fwd(out.data(), ma.t(const_cast<uint8_t*>(a.data()), Fp8Format::E4M3),
                        mw.t(const_cast<uint8_t*>(w.data()), Fp8Format::E4M3), nullptr, N, IC, OC, nullptr);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int k = 0; k < IC; ++k)
        s += double(fp8_decode(a[size_t(r) * IC + k], Fp8Format::E4M3)) * 0.5 *
             fp8_decode(w[size_t(o) * IC + k], Fp8Format::E4M3) * 2.0;
      CHECK_NEAR(out[size_t(r) * OC + o], s, 1e-3 * (1 + std::fabs(s)));
    }
  // dw (OC, IC) += dout_t (OC, N) @ inp_t (IC, N)^T with w's bytes as dout_t (OC x N = 32 x 8 of them)
  const auto dt = codes(size_t(OC) * N), it = codes(size_t(IC) * N);
  be->fp8()->matmul_dw(dw.data(), ma.t(const_cast<uint8_t*>(dt.data()), Fp8Format::E5M2),
                       mw.t(const_cast<uint8_t*>(it.data()), Fp8Format::E4M3), N, IC, OC);
  for (int o = 0; o < OC; ++o)
    for (int i = 0; i < IC; ++i) {
      double s = 1.0;
      for (int r = 0; r < N; ++r)
        s += double(fp8_decode(dt[size_t(o) * N + r], Fp8Format::E5M2)) * 0.5 *
             fp8_decode(it[size_t(i) * N + r], Fp8Format::E4M3) * 2.0;
      CHECK_NEAR(dw[size_t(o) * IC + i], s, 1e-3 * (1 + std::fabs(s)));
    }
}

TEST(scale_update_counts_saturation_and_keeps_the_history) {
  auto be = make_cpu_backend(BackendOptions{});
  const int n = 2, H = 3;
  float amax[n] = {500.0f, 1.0f}, hist[H * n] = {0, 0, 0, 2.0f, 0, 0}, scale[n] = {1.0f, 1.0f};
  float inv[n * fp8::kScaleInvStride] = {};
  const float maxval[n] = {448.0f, 448.0f};
  unsigned sat = 0;
  Fp8ScalesArgs a;
  a.amax = amax, a.history = hist, a.scale = scale, a.scale_inv = inv, a.maxval = maxval, a.saturated = &sat;
  a.n = n, a.H = H, a.row = 0;
  be->fp8()->update_scales(a);
  CHECK(sat == 1);                           // 500 at scale 1 exceeded 448
  CHECK(hist[0] == 500.0f && hist[1] == 1.0f);
  CHECK(scale[0] == 0.5f);                   // 448 / 500
  CHECK(scale[1] == 128.0f);                 // the history's 2.0 wins over this step's 1.0: 448 / 2 -> 128
  CHECK(inv[fp8::kScaleInvStride] == 1.0f / 128.0f);
  CHECK(amax[0] == 0.0f && amax[1] == 0.0f);
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
    be->fp8()->cast(m.t(q.data(), f), nullptr, x.data(), nullptr, nullptr, N, C);
    std::ofstream(dir + "/q_" + fp8_format_name(f) + ".u8", std::ios::binary)
        .write(reinterpret_cast<const char*>(q.data()), q.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--dump") {
    dump(argv[2]);
    return 0;
  }
  return check::run_all(argc > 1 ? argv[1] : nullptr);
}
