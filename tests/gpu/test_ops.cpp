// Every op of the CUDA backend against the CPU backend (the fp32 reference), forward and backward, on
// fresh random inputs, in both CUDA precisions, including awkward sizes (odd row lengths that take the
// scalar paths, T not a multiple of 64). Inputs are rounded to the CUDA activation dtype first, so both
// backends see identical values and the error measured is the op's own.
//
//   test_ops                run the checks (two GoogleTest tests, one per precision); exit 1 on any failure
//   test_ops --bench        also time the ops at GPT-2 124M (B=64) and 1558M (B=16) shapes, T=1024
//
// Without a CUDA device every test is skipped (GoogleTest reports them SKIPPED). Each check prints one
// line (ok / FAIL with its error against its tolerance); a failed one is a GoogleTest failure too.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdarg>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "base/activation.hpp"
#include "test_util.hpp"
#include "parallel/comm.hpp"
#include "config/config.hpp"
#include "optim/optimizer.hpp"
#include "optim/step.hpp"

namespace {

using namespace gpt;
using Vec = std::vector<float>;

// ---- tolerances: relative L2 error ||gpu - ref|| / ||ref||, and the largest elementwise error as a
// fraction of max |ref| (so values near zero in a wide tensor are judged on the tensor's scale).
struct Tol {
  double rel_l2, max_frac;
};
// fp32 elementwise and reduction kernels: only the order of fp32 operations and fast intrinsics
// (__expf, rsqrtf) differ from the CPU, which sums in double in places: ~1e-6 relative.
constexpr Tol kF32Exact{2e-5, 1e-4};
// fp32 precision matmuls run on TF32 tensor cores (10-bit mantissa operands): ~5e-4 relative.
constexpr Tol kF32Tf32{3e-3, 1e-2};
// fp32 precision attention rounds q, k, v, dout to bf16 (cuDNN has no fp32 flash attention).
constexpr Tol kF32Attention{2e-2, 4e-2};
// bf16 outputs: one rounding to 8 significant bits (2^-9 relative) after fp32 math.
constexpr Tol kBf16Elementwise{6e-3, 1e-2};
// bf16 parameters updated twice without master weights, each write rounded stochastically (up to one ulp,
// 2^-7 relative below 2), against the CPU's fp32 parameters: up to two roundings apart
constexpr Tol kBf16TwoWrites{6e-3, 1.6e-2};
// bf16 matmuls: bf16 output rounding plus a different fp32 accumulation order over K.
constexpr Tol kBf16Matmul{8e-3, 2e-2};
// bf16 backward ops whose result is a difference of bf16-rounded terms (LayerNorm dinp) or a sum of
// many rounded products: a few output roundings.
constexpr Tol kBf16Backward{1.5e-2, 3e-2};
// bf16 flash attention: the probabilities are rounded to bf16 before the P @ V product.
constexpr Tol kBf16Attention{2e-2, 4e-2};
// fp32 column sums of values both backends compute in fp32 from the same inputs (LayerNorm's updated
// dinp before it is rounded): only the summation order differs, over up to thousands of rows.
constexpr Tol kColumnSums{1e-4, 1e-3};

int g_failures = 0;
int g_checks = 0;
std::mt19937_64 g_rng(20261129);

float round_bf16(float x) {  // round to nearest even, as the GPU's f32_to_act
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

struct Ctx {
  Backend& cpu;
  Backend& gpu;
  bool bf16;
  const char* prec;
  Vec rnd(size_t n, float lo = -1.0f, float hi = 1.0f) const {
    std::uniform_real_distribution<float> d(lo, hi);
    Vec v(n);
    for (auto& x : v) x = bf16 ? round_bf16(d(g_rng)) : d(g_rng);
    return v;
  }
  Vec act(Vec v) const {  // what the GPU holds for these values
    if (bf16)
      for (auto& x : v) x = round_bf16(x);
    return v;
  }
  Tol pick(Tol f32, Tol b16) const { return bf16 ? b16 : f32; }
};

// ---- device buffers on either backend, with the values given as fp32 on the host
void* up(Backend& b, const Vec& h, bool act = true) {
  const size_t n = h.size();
  if (!act || b.act_dtype() == DType::F32) {
    void* p = b.alloc(n * 4);
    b.copy_h2d(p, h.data(), n * 4);
    return p;
  }
  void* tmp = b.alloc(n * 4);
  b.copy_h2d(tmp, h.data(), n * 4);
  void* p = b.alloc(n * dtype_size(b.act_dtype()));
  b.f32_to_act(p, static_cast<float*>(tmp), n);
  b.synchronize();
  b.free(tmp);
  return p;
}
void* up_int(Backend& b, const std::vector<int>& h) {
  void* p = b.alloc(h.size() * 4);
  b.copy_h2d(p, h.data(), h.size() * 4);
  return p;
}
Vec down(Backend& b, const void* p, size_t n, bool act = true) {
  Vec h(n);
  if (!act || b.act_dtype() == DType::F32) {
    b.copy_d2h(h.data(), p, n * 4);
    return h;
  }
  void* tmp = b.alloc(n * 4);
  b.act_to_f32(static_cast<float*>(tmp), p, n);
  b.copy_d2h(h.data(), tmp, n * 4);
  b.free(tmp);
  return h;
}
Vec poison(size_t n) { return Vec(n, std::nanf("")); }

bool check(const std::string& what, const Vec& got, const Vec& ref, Tol tol) {
  ++g_checks;
  double d2 = 0, r2 = 0, maxref = 0, maxerr = 0;
  size_t worst = 0, bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(got[i]) - ref[i]);
    if (!std::isfinite(got[i])) ++bad;
    d2 += e * e;
    r2 += double(ref[i]) * ref[i];
    maxref = std::max(maxref, std::fabs(double(ref[i])));
    if (!(e <= maxerr)) maxerr = e, worst = i;
  }
  const double rel = std::sqrt(d2 / std::max(r2, 1e-300));
  const double frac = maxerr / std::max(maxref, 1e-30);
  const bool ok = bad == 0 && rel <= tol.rel_l2 && frac <= tol.max_frac;
  std::printf("%-4s %-52s rel_l2 %.2e (tol %.0e)  max_err/max|ref| %.2e (tol %.0e)", ok ? "ok" : "FAIL",
              what.c_str(), rel, tol.rel_l2, frac, tol.max_frac);
  if (!ok)
    std::printf("  worst [%zu] gpu %.6g ref %.6g; %zu non-finite of %zu", worst, double(got[worst]),
                double(ref[worst]), bad, ref.size());
  std::printf("\n");
  if (!ok) {
    ++g_failures;
    ADD_FAILURE() << what << ": rel_l2 " << rel << " (tol " << tol.rel_l2 << "), max_err/max|ref| " << frac
                  << " (tol " << tol.max_frac << "), " << bad << " non-finite";
  }
  return ok;
}
void expect(bool cond, const std::string& what) {
  ++g_checks;
  std::printf("%-4s %s\n", cond ? "ok" : "FAIL", what.c_str());
  if (!cond) {
    ++g_failures;
    ADD_FAILURE() << what;
  }
}
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---- the checks
void test_conversions(Ctx& c, size_t n) {
  Vec x(n);
  std::uniform_real_distribution<float> d(-3, 3);
  for (auto& v : x) v = d(g_rng);
  void* g = up(c.gpu, x);  // f32_to_act
  Vec back = down(c.gpu, g, n);
  check(fmt("[%s] f32_to_act/act_to_f32 n=%zu", c.prec, n), back, c.act(x), kF32Exact);
  Vec a = c.rnd(n), b = c.rnd(n);
  void *ga = up(c.gpu, a), *gb = up(c.gpu, b), *ca = up(c.cpu, a), *cb = up(c.cpu, b);
  c.gpu.add_inplace(ga, gb, n);
  c.cpu.add_inplace(ca, cb, n);
  check(fmt("[%s] add_inplace n=%zu", c.prec, n), down(c.gpu, ga, n), down(c.cpu, ca, n),
        c.pick(kF32Exact, kBf16Elementwise));
  for (void* p : {g, ga, gb}) c.gpu.free(p);
  for (void* p : {ca, cb}) c.cpu.free(p);
}

// pos false: no position embedding (model.pos_embedding false), wpe and dwpe null on both backends
void test_encoder(Ctx& c, int B, int T, int C, int Vp, bool pos = true) {
  std::vector<int> tok(size_t(B) * T);
  std::uniform_int_distribution<int> dt(0, Vp - 1);
  for (auto& t : tok) t = dt(g_rng);
  tok[0] = Vp - 1;  // the last row is reachable
  const Vec wte = c.rnd(size_t(Vp) * C), wpe = c.rnd(size_t(T) * C);
  const size_t n = size_t(B) * T * C;
  void *gt = up_int(c.gpu, tok), *ct = up_int(c.cpu, tok);
  void *gwte = up(c.gpu, wte), *gwpe = up(c.gpu, wpe), *cwte = up(c.cpu, wte), *cwpe = up(c.cpu, wpe);
  void *gout = up(c.gpu, poison(n)), *cout = up(c.cpu, Vec(n));
  c.gpu.encoder_fwd(EncoderFwd{gout, static_cast<int*>(gt), gwte, pos ? gwpe : nullptr, B, T, C});
  c.cpu.encoder_fwd(EncoderFwd{cout, static_cast<int*>(ct), cwte, pos ? cwpe : nullptr, B, T, C});
  const std::string sz = fmt("B=%d T=%d C=%d Vp=%d%s", B, T, C, Vp, pos ? "" : " no wpe");
  check(fmt("[%s] encoder_fwd %s", c.prec, sz.c_str()), down(c.gpu, gout, n), down(c.cpu, cout, n),
        c.pick(kF32Exact, kBf16Elementwise));

  const Vec dout = c.rnd(n), dwte0 = c.rnd(size_t(Vp) * C, -0.1f, 0.1f), dwpe0 = c.rnd(size_t(T) * C, -0.1f, 0.1f);
  void *gd = up(c.gpu, dout), *cd = up(c.cpu, dout);
  void *gdwte = up(c.gpu, dwte0), *gdwpe = up(c.gpu, dwpe0), *cdwte = up(c.cpu, dwte0), *cdwpe = up(c.cpu, dwpe0);
  c.gpu.encoder_bwd(EncoderBwd{gdwte, pos ? gdwpe : nullptr, gd, static_cast<int*>(gt), B, T, C});
  c.cpu.encoder_bwd(EncoderBwd{cdwte, pos ? cdwpe : nullptr, cd, static_cast<int*>(ct), B, T, C});
  const Vec r1 = down(c.gpu, gdwte, wte.size());
  check(fmt("[%s] encoder_bwd dwte %s", c.prec, sz.c_str()), r1, down(c.cpu, cdwte, wte.size()),
        c.pick(kF32Exact, kBf16Backward));
  // without wpe its gradient is untouched on both: dwpe0 still
  check(fmt("[%s] encoder_bwd dwpe %s", c.prec, sz.c_str()), down(c.gpu, gdwpe, wpe.size()),
        pos ? down(c.cpu, cdwpe, wpe.size()) : dwpe0, c.pick(kF32Exact, kBf16Backward));
  // deterministic: the same inputs give the same bits
  c.gpu.free(gdwte);
  gdwte = up(c.gpu, dwte0);
  c.gpu.encoder_bwd(EncoderBwd{gdwte, pos ? gdwpe : nullptr, gd, static_cast<int*>(gt), B, T, C});
  const Vec r2 = down(c.gpu, gdwte, wte.size());
  expect(std::memcmp(r1.data(), r2.data(), r1.size() * 4) == 0,
         fmt("[%s] encoder_bwd dwte bitwise deterministic %s", c.prec, sz.c_str()));
  for (void* p : {gt, gwte, gwpe, gout, gd, gdwte, gdwpe}) c.gpu.free(p);
  for (void* p : {ct, cwte, cwpe, cout, cd, cdwte, cdwpe}) c.cpu.free(p);
}

// A norm op on one backend: the forward (plain, or with the residual add when b is set) and the backward
NormFwd norm_fwd_op(NormKind k, void* out, void* mean, void* rstd, void* residual, const void* a, const void* b,
                    const void* w, const void* bias, int N, int C) {
  NormFwd op;
  op.kind = k, op.out = out, op.mean = k == NormKind::layernorm ? (float*)mean : nullptr, op.rstd = (float*)rstd;
  op.residual = residual, op.a = a, op.b = b, op.w = w, op.bias = k == NormKind::layernorm ? bias : nullptr;
  op.N = N, op.C = C;
  return op;
}
NormBwd norm_bwd_op(NormKind k, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                    const void* mean, const void* rstd, int N, int C, void* colsum) {
  NormBwd op;
  op.kind = k, op.dinp = dinp, op.dw = dw, op.db = k == NormKind::layernorm ? db : nullptr, op.dout = dout;
  op.inp = inp, op.w = w, op.mean = k == NormKind::layernorm ? (const float*)mean : nullptr;
  op.rstd = (const float*)rstd, op.N = N, op.C = C, op.dinp_colsum = (float*)colsum;
  return op;
}

// Every norm kind, with its bias or without (model.bias false), forward (plain and residual) and backward
// (with and without the column sums)
void test_norm(Ctx& c, const tests::NormVariant& v, int N, int C) {
  const NormKind k = v.kind;
  const bool ln = k == NormKind::layernorm, has_bias = v.bias;
  const char* kn = v.name;
  const size_t n = size_t(N) * C;
  const std::string sz = fmt("N=%d C=%d", N, C);
  const Vec inp = c.rnd(n, -2, 2), w = c.rnd(C, 0.5f, 1.5f), b = c.rnd(C, -0.5f, 0.5f);
  void *gi = up(c.gpu, inp), *gw = up(c.gpu, w), *gb = up(c.gpu, b);
  void *ci = up(c.cpu, inp), *cw = up(c.cpu, w), *cb = up(c.cpu, b);
  void *go = up(c.gpu, poison(n)), *co = up(c.cpu, Vec(n));
  void *gm = up(c.gpu, poison(N), false), *gr = up(c.gpu, poison(N), false);
  void *cm = up(c.cpu, Vec(N), false), *cr = up(c.cpu, Vec(N), false);
  const Tol tol = c.pick(kF32Exact, kBf16Elementwise);
  c.gpu.norm_fwd(norm_fwd_op(k, go, gm, gr, nullptr, gi, nullptr, gw, has_bias ? gb : nullptr, N, C));
  c.cpu.norm_fwd(norm_fwd_op(k, co, cm, cr, nullptr, ci, nullptr, cw, has_bias ? cb : nullptr, N, C));
  check(fmt("[%s] %s_fwd out %s", c.prec, kn, sz.c_str()), down(c.gpu, go, n), down(c.cpu, co, n), tol);
  if (ln)
    check(fmt("[%s] %s_fwd mean %s", c.prec, kn, sz.c_str()), down(c.gpu, gm, N, false), down(c.cpu, cm, N, false),
          kF32Exact);
  check(fmt("[%s] %s_fwd rstd %s", c.prec, kn, sz.c_str()), down(c.gpu, gr, N, false), down(c.cpu, cr, N, false),
        kF32Exact);

  // residual variant
  const Vec a2 = c.rnd(n), b2 = c.rnd(n);
  void *ga = up(c.gpu, a2), *gb2 = up(c.gpu, b2), *ca = up(c.cpu, a2), *cb2 = up(c.cpu, b2);
  void *gres = up(c.gpu, poison(n)), *cres = up(c.cpu, Vec(n));
  void *gro = up(c.gpu, poison(n)), *cro = up(c.cpu, Vec(n));
  void *grm = up(c.gpu, poison(N), false), *grr = up(c.gpu, poison(N), false);
  void *crm = up(c.cpu, Vec(N), false), *crr = up(c.cpu, Vec(N), false);
  c.gpu.norm_fwd(norm_fwd_op(k, gro, grm, grr, gres, ga, gb2, gw, has_bias ? gb : nullptr, N, C));
  c.cpu.norm_fwd(norm_fwd_op(k, cro, crm, crr, cres, ca, cb2, cw, has_bias ? cb : nullptr, N, C));
  check(fmt("[%s] residual_%s_fwd residual %s", c.prec, kn, sz.c_str()), down(c.gpu, gres, n),
        down(c.cpu, cres, n), tol);
  // the CPU normalises the unrounded sum; the GPU the stored (rounded) residual, as the backward sees
  check(fmt("[%s] residual_%s_fwd out %s", c.prec, kn, sz.c_str()), down(c.gpu, gro, n), down(c.cpu, cro, n),
        c.pick(kF32Exact, kBf16Backward));
  for (void* p : {ga, gb2, gres, gro, grm, grr}) c.gpu.free(p);
  for (void* p : {ca, cb2, cres, cro, crm, crr}) c.cpu.free(p);

  // backward of the plain forward above, from the CPU's statistics so both see the same mean/rstd; once
  // without and once with the column sums of the updated dinp
  const Vec mean = down(c.cpu, cm, N, false), rstd = down(c.cpu, cr, N, false);
  void *gm2 = up(c.gpu, mean, false), *gr2 = up(c.gpu, rstd, false);
  const Vec dout = c.rnd(n), dinp0 = c.rnd(n, -0.5f, 0.5f), dw0 = c.rnd(C, -0.5f, 0.5f), db0 = c.rnd(C, -0.5f, 0.5f);
  void *gdo = up(c.gpu, dout), *cdo = up(c.cpu, dout);
  void *cdi = up(c.cpu, dinp0), *cdw = up(c.cpu, dw0), *cdb = up(c.cpu, db0), *ccs = up(c.cpu, Vec(C), false);
  c.cpu.norm_bwd(norm_bwd_op(k, cdi, cdw, has_bias ? cdb : nullptr, cdo, ci, cw, cm, cr, N, C, ccs));
  const Vec rdi = down(c.cpu, cdi, n), rdw = down(c.cpu, cdw, C), rdb = down(c.cpu, cdb, C);
  const Tol tb = c.pick(kF32Exact, kBf16Backward);
  for (bool colsum : {false, true}) {
    void *gdi = up(c.gpu, dinp0), *gdw = up(c.gpu, dw0), *gdb = up(c.gpu, db0);
    void* gcs = colsum ? up(c.gpu, poison(C), false) : nullptr;
    c.gpu.norm_bwd(norm_bwd_op(k, gdi, gdw, has_bias ? gdb : nullptr, gdo, gi, gw, gm2, gr2, N, C, gcs));
    const char* with = colsum ? " +colsum" : "";
    check(fmt("[%s] %s_bwd%s dinp %s", c.prec, kn, with, sz.c_str()), down(c.gpu, gdi, n), rdi, tb);
    check(fmt("[%s] %s_bwd%s dw %s", c.prec, kn, with, sz.c_str()), down(c.gpu, gdw, C), rdw, tb);
    // without a bias (RMSNorm's, model.bias false) db stays as it was on both backends
    check(fmt("[%s] %s_bwd%s db %s", c.prec, kn, with, sz.c_str()), down(c.gpu, gdb, C), rdb, tb);
    if (colsum)
      check(fmt("[%s] %s_bwd dinp column sums %s", c.prec, kn, sz.c_str()), down(c.gpu, gcs, C, false),
            down(c.cpu, ccs, C, false), kColumnSums);
    for (void* p : {gdi, gdw, gdb, gcs})
      if (p) c.gpu.free(p);
  }
  if (!has_bias) check(fmt("[%s] %s_bwd leaves db %s", c.prec, kn, sz.c_str()), rdb, db0, kF32Exact);
  for (void* p : {gi, gw, gb, go, gm, gr, gm2, gr2, gdo}) c.gpu.free(p);
  for (void* p : {ci, cw, cb, co, cm, cr, cdo, cdi, cdw, cdb, ccs}) c.cpu.free(p);
}

// gelu: with the activation `act` on the output (forward) and its derivative on dinp (backward)
void test_matmul(Ctx& c, int N, int IC, int OC, bool bias, bool gelu, Activation act = Activation::gelu) {
  const std::string sz =
      fmt("N=%d IC=%d OC=%d%s%s", N, IC, OC, bias ? " bias" : "", gelu ? (act == Activation::gelu ? " gelu" : " relu2") : "");
  auto fwd = [&](Backend& b, void* out, const void* inp, const void* w, const void* bias_, void* pre) {
    MatmulFwd op;
    op.out = out, op.inp = values(inp), op.w = values(w), op.bias = bias_, op.pre_gelu = pre, op.act = act;
    op.N = N, op.IC = IC, op.OC = OC;
    b.matmul_fwd(op);
  };
  auto bwd = [&](Backend& b, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                 const void* pre, const float* colsum) {
    MatmulBwd op;
    op.dinp = dinp, op.dw = dw, op.dbias = dbias, op.dout = values(dout), op.inp = values(inp), op.w = values(w);
    op.pre_gelu = pre, op.act = act, op.dout_colsum = colsum, op.N = N, op.IC = IC, op.OC = OC;
    b.matmul_bwd(op);
  };
  const Vec inp = c.rnd(size_t(N) * IC), w = c.rnd(size_t(OC) * IC, -0.1f, 0.1f), b = c.rnd(OC);
  void *gi = up(c.gpu, inp), *gw = up(c.gpu, w), *gb = bias ? up(c.gpu, b) : nullptr;
  void *ci = up(c.cpu, inp), *cw = up(c.cpu, w), *cb = bias ? up(c.cpu, b) : nullptr;
  const size_t no = size_t(N) * OC;
  void *go = up(c.gpu, poison(no)), *co = up(c.cpu, Vec(no));
  void *gpg = gelu ? up(c.gpu, poison(no)) : nullptr, *cpg = gelu ? up(c.cpu, Vec(no)) : nullptr;
  fwd(c.gpu, go, gi, gw, gb, gpg);
  fwd(c.cpu, co, ci, cw, cb, cpg);
  const Tol tol = c.pick(kF32Tf32, kBf16Matmul);
  check(fmt("[%s] matmul_fwd out %s", c.prec, sz.c_str()), down(c.gpu, go, no), down(c.cpu, co, no), tol);
  if (gelu)
    check(fmt("[%s] matmul_fwd pre_gelu %s", c.prec, sz.c_str()), down(c.gpu, gpg, no), down(c.cpu, cpg, no), tol);

  // backward: here the GELU sits on the input side, pre_gelu (N, IC)
  const Vec dout = c.rnd(no), dw0 = c.rnd(size_t(OC) * IC), db0 = c.rnd(OC);
  const Vec pre = c.rnd(size_t(N) * IC, -3, 3);
  void *gdo = up(c.gpu, dout), *cdo = up(c.cpu, dout);
  void *gdi = up(c.gpu, poison(size_t(N) * IC)), *cdi = up(c.cpu, Vec(size_t(N) * IC));
  void *gdw = up(c.gpu, dw0), *cdw = up(c.cpu, dw0);
  void *gdb = bias ? up(c.gpu, db0) : nullptr, *cdb = bias ? up(c.cpu, db0) : nullptr;
  void *gpre = gelu ? up(c.gpu, pre) : nullptr, *cpre = gelu ? up(c.cpu, pre) : nullptr;
  bwd(c.gpu, gdi, gdw, gdb, gdo, gi, gw, gpre, nullptr);
  bwd(c.cpu, cdi, cdw, cdb, cdo, ci, cw, cpre, nullptr);
  check(fmt("[%s] matmul_bwd dinp %s", c.prec, sz.c_str()), down(c.gpu, gdi, size_t(N) * IC),
        down(c.cpu, cdi, size_t(N) * IC), tol);
  check(fmt("[%s] matmul_bwd dw %s", c.prec, sz.c_str()), down(c.gpu, gdw, size_t(OC) * IC),
        down(c.cpu, cdw, size_t(OC) * IC), tol);
  if (bias) {
    const Vec ref = down(c.cpu, cdb, OC);
    check(fmt("[%s] matmul_bwd dbias %s", c.prec, sz.c_str()), down(c.gpu, gdb, OC), ref,
          c.pick(kF32Exact, kBf16Backward));
    // the bias gradient from column sums given with dout (what a LayerNorm backward hands on)
    std::vector<double> acc(OC, 0.0);
    for (size_t i = 0; i < size_t(N); ++i)
      for (int o = 0; o < OC; ++o) acc[o] += dout[i * OC + o];
    const Vec sums(acc.begin(), acc.end());
    void* gsums = up(c.gpu, sums, false);
    c.gpu.free(gdb);
    gdb = up(c.gpu, db0);
    bwd(c.gpu, gdi, gdw, gdb, gdo, gi, gw, gpre, static_cast<float*>(gsums));
    check(fmt("[%s] matmul_bwd dbias from column sums %s", c.prec, sz.c_str()), down(c.gpu, gdb, OC), ref,
          c.pick(kF32Exact, kBf16Backward));
    c.gpu.free(gsums);
  }
  for (void* p : {gi, gw, gb, go, gpg, gdo, gdi, gdw, gdb, gpre})
    if (p) c.gpu.free(p);
  for (void* p : {ci, cw, cb, co, cpg, cdo, cdi, cdw, cdb, cpre})
    if (p) c.cpu.free(p);
}

void test_attention(Ctx& c, int B, int T, int NH, int HS) {
  const std::string sz = fmt("B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
  const size_t C = size_t(NH) * HS, n3 = size_t(B) * T * 3 * C, n = size_t(B) * T * C, nl = size_t(B) * NH * T;
  const Vec qkv = c.rnd(n3, -2, 2);
  void *gq = up(c.gpu, qkv), *cq = up(c.cpu, qkv);
  void *go = up(c.gpu, poison(n)), *co = up(c.cpu, Vec(n));
  void *gl = up(c.gpu, poison(nl), false), *cl = up(c.cpu, Vec(nl), false);
  c.gpu.attention_fwd(AttentionFwd{go, (float*)gl, gq, B, T, NH, HS});
  c.cpu.attention_fwd(AttentionFwd{co, (float*)cl, cq, B, T, NH, HS});
  const Tol tol = c.pick(kF32Attention, kBf16Attention);
  check(fmt("[%s] attention_fwd out %s", c.prec, sz.c_str()), down(c.gpu, go, n), down(c.cpu, co, n), tol);
  check(fmt("[%s] attention_fwd lse %s", c.prec, sz.c_str()), down(c.gpu, gl, nl, false),
        down(c.cpu, cl, nl, false), c.pick(Tol{1e-3, 2e-3}, Tol{1e-3, 2e-3}));

  // backward from the same (rounded) out and lse on both sides
  const Vec out = c.act(down(c.cpu, co, n)), lse = down(c.cpu, cl, nl, false), dout = c.rnd(n);
  void *go2 = up(c.gpu, out), *co2 = up(c.cpu, out), *gl2 = up(c.gpu, lse, false), *cl2 = up(c.cpu, lse, false);
  void *gdo = up(c.gpu, dout), *cdo = up(c.cpu, dout);
  void *gdq = up(c.gpu, poison(n3)), *cdq = up(c.cpu, Vec(n3));
  c.gpu.attention_bwd(AttentionBwd{gdq, gdo, gq, go2, (float*)gl2, B, T, NH, HS});
  c.cpu.attention_bwd(AttentionBwd{cdq, cdo, cq, co2, (float*)cl2, B, T, NH, HS});
  check(fmt("[%s] attention_bwd dqkv %s", c.prec, sz.c_str()), down(c.gpu, gdq, n3), down(c.cpu, cdq, n3), tol);
  for (void* p : {gq, go, gl, go2, gl2, gdo, gdq}) c.gpu.free(p);
  for (void* p : {cq, co, cl, co2, cl2, cdo, cdq}) c.cpu.free(p);
}

// rotary position embedding in place, forward and inverse, on the same qkv (v must come back untouched)
void test_rope(Ctx& c, int B, int T, int NH, int HS) {
  const std::string sz = fmt("B=%d T=%d NH=%d HS=%d", B, T, NH, HS);
  const size_t n = size_t(B) * T * 3 * NH * HS;
  const Vec qkv = c.act(c.rnd(n, -2, 2));
  for (bool inverse : {false, true}) {
    void *g = up(c.gpu, qkv), *cc = up(c.cpu, qkv);
    c.gpu.rope(Rope{g, B, T, NH, HS, inverse});
    c.cpu.rope(Rope{cc, B, T, NH, HS, inverse});
    check(fmt("[%s] %s %s", c.prec, inverse ? "rope_bwd" : "rope_fwd", sz.c_str()), down(c.gpu, g, n), down(c.cpu, cc, n),
          c.pick(kF32Exact, kBf16Elementwise));
    c.gpu.free(g);
    c.cpu.free(cc);
  }
}

// the activation and its derivative in place (exact zeros included: relu2 at and below 0)
void test_activation(Ctx& c, Activation act, size_t n) {
  const char* name = activation_op_names(act).fwd;
  Vec x = c.rnd(n, -5, 5);
  for (size_t i = 0; i < n; i += 97) x[i] = 0.0f;
  const Vec d = c.rnd(n);
  void *g = up(c.gpu, x), *cc = up(c.cpu, x), *go = up(c.gpu, poison(n)), *co = up(c.cpu, Vec(n));
  c.gpu.activation_fwd(ActivationFwd{go, g, n, act});
  c.cpu.activation_fwd(ActivationFwd{co, cc, n, act});
  check(fmt("[%s] %s n=%zu", c.prec, name, n), down(c.gpu, go, n), down(c.cpu, co, n), c.pick(kF32Exact, kBf16Elementwise));
  void *gd = up(c.gpu, d), *cd = up(c.cpu, d);
  c.gpu.activation_bwd(ActivationBwd{gd, g, n, act});
  c.cpu.activation_bwd(ActivationBwd{cd, cc, n, act});
  check(fmt("[%s] %s n=%zu", c.prec, activation_op_names(act).bwd, n), down(c.gpu, gd, n), down(c.cpu, cd, n),
        c.pick(kF32Exact, kBf16Elementwise));
  for (void* p : {g, go, gd}) c.gpu.free(p);
  for (void* p : {cc, co, cd}) c.cpu.free(p);
}

void test_classifier(Ctx& c, int N, int V, int Vp) {
  const std::string sz = fmt("N=%d V=%d Vp=%d", N, V, Vp);
  Vec logits = c.rnd(size_t(N) * Vp, -6, 6);
  std::vector<int> tg(N);
  std::uniform_int_distribution<int> d(0, V - 1);
  for (auto& t : tg) t = d(g_rng);
  tg[0] = V - 1;
  void *gt = up_int(c.gpu, tg), *ct = up_int(c.cpu, tg);
  void *gz = up(c.gpu, logits), *cz = up(c.cpu, logits);
  void *gl = up(c.gpu, poison(N), false), *cl = up(c.cpu, Vec(N), false);
  // dloss = 0: losses only, logits untouched
  c.gpu.classifier(gz, (float*)gl, (int*)gt, N, V, Vp, 0.0f);
  c.cpu.classifier(cz, (float*)cl, (int*)ct, N, V, Vp, 0.0f);
  check(fmt("[%s] classifier losses (no grad) %s", c.prec, sz.c_str()), down(c.gpu, gl, N, false),
        down(c.cpu, cl, N, false), kF32Exact);
  const Vec same = down(c.gpu, gz, logits.size());
  expect(std::memcmp(same.data(), logits.data(), logits.size() * 4) == 0,
         fmt("[%s] classifier leaves logits alone when dloss = 0 %s", c.prec, sz.c_str()));
  const float dloss = 1.0f / N;
  c.gpu.classifier(gz, (float*)gl, (int*)gt, N, V, Vp, dloss);
  c.cpu.classifier(cz, (float*)cl, (int*)ct, N, V, Vp, dloss);
  check(fmt("[%s] classifier losses %s", c.prec, sz.c_str()), down(c.gpu, gl, N, false), down(c.cpu, cl, N, false),
        kF32Exact);
  const Vec gg = down(c.gpu, gz, logits.size()), cg = down(c.cpu, cz, logits.size());
  check(fmt("[%s] classifier dlogits %s", c.prec, sz.c_str()), gg, cg, c.pick(kF32Exact, kBf16Elementwise));
  bool pad_zero = true;
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) pad_zero = pad_zero && gg[size_t(i) * Vp + j] == 0.0f;
  expect(pad_zero, fmt("[%s] classifier padded columns zeroed %s", c.prec, sz.c_str()));
  for (void* p : {gt, gz, gl}) c.gpu.free(p);
  for (void* p : {ct, cz, cl}) c.cpu.free(p);
}

// Compensated master weights split on the device at initialisation (optim::compensated_residuals_cuda)
// against the host's split, bit for bit: values over many binades, signed zeros, subnormals, values that
// round up to the next binade, and the largest finite values.
void test_compensated_split(Ctx& c, size_t n) {
  Vec w(n);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-140, 127);
  for (size_t i = 0; i < n; ++i) w[i] = std::ldexp(mant(g_rng), ex(g_rng)) * (i % 2 ? -1.0f : 1.0f);
  const float special[] = {0.0f, -0.0f, 1e-45f, -1e-40f, 1.0f, 1.00390625f, 1.99999988f, 3.40282347e38f, -3.40282347e38f};
  for (size_t i = 0; i < std::size(special) && i < n; ++i) w[i] = special[i];
  float* gw = static_cast<float*>(c.gpu.alloc(4 * n));
  uint16_t* gr = static_cast<uint16_t*>(c.gpu.alloc(2 * n));
  c.gpu.copy_h2d(gw, w.data(), 4 * n);
  c.gpu.run_op("compensated_split", [&](void* s) { optim::compensated_residuals_cuda(gr, gw, n, s); });
  std::vector<uint16_t> got(n);
  c.gpu.copy_d2h(got.data(), gr, 2 * n);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += got[i] != optim::compensated_split(w[i]).lo;
  expect(differ == 0, fmt("[%s] compensated_split n=%zu: %zu residuals differ from the host's", c.prec, n, differ));
  c.gpu.free(gw);
  c.gpu.free(gr);
}

void test_sum_squares(Ctx& c, size_t n) {
  const Vec x = c.rnd(n);
  void *g = up(c.gpu, x), *cc = up(c.cpu, x);
  const double a = c.gpu.sum_squares(SumSquares{g, n}), b = c.cpu.sum_squares(SumSquares{cc, n});
  // fp32 per-thread partial sums against the CPU's double: ~1e-6 relative
  check(fmt("[%s] sum_squares n=%zu", c.prec, n), Vec{float(a)}, Vec{float(b)}, Tol{1e-5, 1e-5});
  // the queued form into device memory: the same sum
  double* out = static_cast<double*>(c.gpu.alloc(sizeof(double)));
  c.gpu.sum_squares(SumSquares{g, n, out});
  double queued = 0;
  c.gpu.copy_d2h(&queued, out, sizeof queued);
  check(fmt("[%s] sum_squares queued n=%zu", c.prec, n), Vec{float(queued)}, Vec{float(b)}, Tol{1e-5, 1e-5});
  c.gpu.free(out);
  c.gpu.free(g);
  c.cpu.free(cc);
}

// GPT-2's initialisation: the GPU's values are the CPU's bit for bit (the device draws, the host redraws
// those near a float rounding boundary: about one in 2^16, so 2^24 values put some hundreds through it),
// from an index and to an address neither aligned.
void test_normal_init(Ctx& c, size_t n, uint64_t seed, uint64_t index, float std) {
  float* g = static_cast<float*>(c.gpu.alloc(4 * (n + 1)));
  Vec cpu(n);
  c.gpu.normal_init(NormalInit{g + 1, n, seed, index, std});
  c.cpu.normal_init(NormalInit{cpu.data(), n, seed, index, std});
  Vec gpu(n);
  c.gpu.copy_d2h(gpu.data(), g + 1, 4 * n);
  c.gpu.free(g);
  size_t differ = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&gpu[i], &cpu[i], 4) != 0 && differ++ == 0) first = i;
  double sum = 0, sq = 0;
  for (float v : cpu) sum += v, sq += double(v) * v;
  const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
  expect(differ == 0 && std::fabs(sd / std - 1) < 0.01 && std::fabs(mean) < 0.01 * std,
         fmt("[%s] normal_init n=%zu index=%llu: %zu value(s) differ from the CPU's%s; std %.5g of %.5g", c.prec, n,
             (unsigned long long)index, differ,
             differ ? fmt(" (first [%zu] gpu %.9g cpu %.9g)", first, gpu[first], cpu[first]).c_str() : "", sd,
             double(std)));
}

// An optimizer's update (optim/rules.hpp) on the GPU against the CPU loop: the same rule on the same
// fp32 values, so the state matches exactly and the bf16 parameters to one rounding.
void test_optimizer(Ctx& c, const char* name, size_t n, bool master) {
  const std::string sz = fmt("%s n=%zu %s", name, n, master ? "master" : "no-master");
  auto opt = make_optimizer(name, true);
  const size_t K = opt->slots().size();
  std::uniform_real_distribution<float> d(-1, 1), dv(0, 1e-2f);
  Vec w(n), g = c.rnd(n, -0.1f, 0.1f);
  std::vector<Vec> s(K, Vec(n));
  for (size_t i = 0; i < n; ++i) {
    w[i] = d(g_rng);
    for (size_t k = 0; k < K; ++k) s[k][i] = k == 1 ? dv(g_rng) : 1e-2f * d(g_rng);  // AdamW's v >= 0
  }
  if (!master) w = c.act(w);
  OptimizerHyper h;
  h.lr = 1e-2f, h.weight_decay = 0.1f, h.grad_scale = 0.7f, h.step = 3, h.seed = 1234;
  // CPU: its fp32 param is the master
  ParamRange cr;
  void *cw = up(c.cpu, w), *cg = up(c.cpu, g);
  std::vector<void*> cs, gs;
  for (size_t k = 0; k < K; ++k) cs.push_back(up(c.cpu, s[k], false)), gs.push_back(up(c.gpu, s[k], false));
  cr.param = cw, cr.grad = cg, cr.n = n, cr.decay = true;
  for (size_t k = 0; k < K; ++k) cr.slot[k] = (float*)cs[k];
  opt->update(c.cpu, cr, h);
  void* gg = up(c.gpu, g);
  void* gmaster = master ? up(c.gpu, w, false) : nullptr;
  void* gp = master ? up(c.gpu, poison(n)) : up(c.gpu, w);
  ParamRange gr = cr;
  gr.param = gp, gr.master = (float*)gmaster, gr.grad = gg;
  for (size_t k = 0; k < K; ++k) gr.slot[k] = (float*)gs[k];
  opt->update(c.gpu, gr, h);
  const Vec ref = down(c.cpu, cw, n);
  for (size_t k = 0; k < K; ++k)
    check(fmt("[%s] %s %s", c.prec, opt->slots()[k].c_str(), sz.c_str()), down(c.gpu, gs[k], n, false),
          down(c.cpu, cs[k], n, false), kF32Exact);
  const Vec p = down(c.gpu, gp, n);
  if (master) check(fmt("[%s] master %s", c.prec, sz.c_str()), down(c.gpu, gmaster, n, false), ref, kF32Exact);
  check(fmt("[%s] param %s", c.prec, sz.c_str()), p, ref, c.pick(kF32Exact, kBf16Elementwise));
  if (c.bf16 && master) {
    // stochastic rounding: every param is one of the two bf16 neighbours of its master value, and a
    // good share of them is not the nearest one
    const Vec mw = down(c.gpu, gmaster, n, false);
    size_t not_nearest = 0, outside = 0;
    for (size_t i = 0; i < n; ++i) {
      const float lo_hi = std::fabs(mw[i]) * (1.0f / 128);  // at least one bf16 ulp
      if (std::fabs(p[i] - mw[i]) > lo_hi) ++outside;
      if (p[i] != round_bf16(mw[i])) ++not_nearest;
    }
    expect(outside == 0 && not_nearest > n / 10 && not_nearest < n * 6 / 10,
           fmt("[%s] %s stochastic rounding: %zu of %zu not nearest, %zu beyond one ulp", c.prec, name, not_nearest, n,
               outside));
  }
  for (void* q : {gg, gmaster, gp})
    if (q) c.gpu.free(q);
  for (void* q : gs) c.gpu.free(q);
  for (void* q : {cw, cg}) c.cpu.free(q);
  for (void* q : cs) c.cpu.free(q);
}

// The low-precision optimizer state (training.optimizer_state, optim/state.hpp) on the GPU against the CPU
// loop: two steps from zero state on the same gradients (spread over decades, as moments are); the state's
// bytes (bf16 values, or int8 codes and block scales) must be the CPU's, every one, and the parameters
// match as the fp32 state's do.
void test_optimizer_state(Ctx& c, const char* name, optim::StateType t, size_t n, bool master) {
  const std::string sz = fmt("%s %s n=%zu %s", name, optim::state_type_name(t), n, master ? "master" : "no-master");
  auto opt = make_optimizer(name, true, t);
  const size_t K = opt->slots().size(), bytes = optim::state_type_size(t) * n, nb = optim::quant_blocks(n);
  std::uniform_real_distribution<float> d(-1, 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Vec w(n);
  for (auto& x : w) x = d(g_rng);
  if (!master) w = c.act(w);
  std::vector<void*> cs, gs, csc, gsc;
  auto zeroed = [](Backend& b, size_t sz) {
    void* q = b.alloc(std::max<size_t>(sz, 4));
    b.zero(q, std::max<size_t>(sz, 4));
    return q;
  };
  for (size_t k = 0; k < K; ++k) {
    cs.push_back(zeroed(c.cpu, bytes)), gs.push_back(zeroed(c.gpu, bytes));
    csc.push_back(zeroed(c.cpu, 4 * nb)), gsc.push_back(zeroed(c.gpu, 4 * nb));
  }
  void* cw = up(c.cpu, w);
  void* gmaster = master ? up(c.gpu, w, false) : nullptr;
  void* gp = master ? up(c.gpu, poison(n)) : up(c.gpu, w);
  OptimizerHyper h;
  h.lr = 1e-2f, h.weight_decay = 0.1f, h.grad_scale = 0.7f, h.seed = 1234;
  for (int st = 1; st <= 2; ++st) {
    h.step = st, h.seed += uint64_t(st);
    Vec g(n);
    for (auto& x : g) x = 0.1f * d(g_rng) * std::exp(2.0f * nd(g_rng));
    g = c.act(g);
    void *cg = up(c.cpu, g), *gg = up(c.gpu, g);
    ParamRange cr;
    cr.param = cw, cr.grad = cg, cr.n = n, cr.n_decay = n / 3;
    for (size_t k = 0; k < K; ++k) cr.slot[k] = cs[k], cr.scale[k] = static_cast<float*>(csc[k]);
    opt->update(c.cpu, cr, h);
    ParamRange gr = cr;
    gr.param = gp, gr.master = static_cast<float*>(gmaster), gr.grad = gg;
    for (size_t k = 0; k < K; ++k) gr.slot[k] = gs[k], gr.scale[k] = static_cast<float*>(gsc[k]);
    opt->update(c.gpu, gr, h);
    for (size_t k = 0; k < K; ++k) {
      std::vector<char> a(bytes + 4 * nb), b(bytes + 4 * nb);
      c.cpu.copy_d2h(a.data(), cs[k], bytes);
      c.gpu.copy_d2h(b.data(), gs[k], bytes);
      if (t == optim::StateType::Int8) {
        c.cpu.copy_d2h(a.data() + bytes, csc[k], 4 * nb);
        c.gpu.copy_d2h(b.data() + bytes, gsc[k], 4 * nb);
      }
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
      expect(differ == 0, fmt("[%s] %s state bytes after step %d %s: %zu of %zu differ", c.prec,
                              opt->slots()[k].c_str(), st, sz.c_str(), differ, a.size()));
    }
    c.cpu.free(cg);
    c.gpu.free(gg);
  }
  const Vec ref = down(c.cpu, cw, n);
  if (master) check(fmt("[%s] master %s", c.prec, sz.c_str()), down(c.gpu, gmaster, n, false), ref, kF32Exact);
  check(fmt("[%s] param %s", c.prec, sz.c_str()), down(c.gpu, gp, n), ref,
        c.pick(kF32Exact, master ? kBf16Elementwise : kBf16TwoWrites));
  for (void* q : {gmaster, gp})
    if (q) c.gpu.free(q);
  for (void* q : gs) c.gpu.free(q);
  for (void* q : gsc) c.gpu.free(q);
  c.cpu.free(cw);
  for (void* q : cs) c.cpu.free(q);
  for (void* q : csc) c.cpu.free(q);
}

// Compensated master weights (training.master_weights: compensated) on the GPU against the CPU loop run
// on the master values they stand for: the CPU's fp32 parameter starts at hi + lo and its update,
// split again (optim/state.hpp), must be the GPU's bf16 parameter and residual, every bit; fp32 state
// (the vectorised kernel) and int8 state (the blocks' kernel), two steps. bf16 runs only.
void test_optimizer_compensated(Ctx& c, const char* name, optim::StateType t, size_t n) {
  if (!c.bf16) return;
  const std::string sz = fmt("%s %s n=%zu compensated", name, optim::state_type_name(t), n);
  auto opt = make_optimizer(name, true, t);
  const size_t K = opt->slots().size(), bytes = optim::state_bytes(t, n), nb = optim::quant_blocks(n);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<uint16_t> hi(n), lo(n);
  Vec w(n);
  for (size_t i = 0; i < n; ++i) {
    const optim::Compensated s = optim::compensated_split(d(g_rng) * (i % 7 == 0 ? 1e-3f : 1.0f));
    hi[i] = s.hi, lo[i] = s.lo;
    w[i] = optim::compensated_value(s.hi, s.lo);
  }
  void* cw = up(c.cpu, w);
  void* gp = c.gpu.alloc(2 * n);
  void* gres = c.gpu.alloc(2 * n);
  c.gpu.copy_h2d(gp, hi.data(), 2 * n);
  c.gpu.copy_h2d(gres, lo.data(), 2 * n);
  std::vector<void*> cs, gs;
  for (size_t k = 0; k < 2 * K; ++k) {
    Backend& b = k < K ? c.cpu : c.gpu;
    void* q = b.alloc(std::max<size_t>(bytes, 4));
    b.zero(q, std::max<size_t>(bytes, 4));
    (k < K ? cs : gs).push_back(q);
  }
  std::vector<void*> csc, gsc;
  for (size_t k = 0; k < 2 * K; ++k) {
    Backend& b = k < K ? c.cpu : c.gpu;
    void* q = b.alloc(4 * nb);
    b.zero(q, 4 * nb);
    (k < K ? csc : gsc).push_back(q);
  }
  OptimizerHyper h;
  h.lr = 1e-2f, h.weight_decay = 0.1f, h.grad_scale = 0.7f, h.seed = 99;
  for (int st = 1; st <= 2; ++st) {
    h.step = st, h.seed += uint64_t(st);
    const Vec g = c.act(c.rnd(n, -0.1f, 0.1f));
    void *cg = up(c.cpu, g), *gg = up(c.gpu, g);
    ParamRange cr;
    cr.param = cw, cr.grad = cg, cr.n = n, cr.decay = true, cr.n_decay = n / 3;
    for (size_t k = 0; k < K; ++k) cr.slot[k] = cs[k], cr.scale[k] = static_cast<float*>(csc[k]);
    opt->update(c.cpu, cr, h);
    {  // the CPU's master values as the GPU holds them: split into parameter and residual, and back
      Vec v = down(c.cpu, cw, n);
      for (float& x : v) {
        const optim::Compensated s = optim::compensated_split(x);
        x = optim::compensated_value(s.hi, s.lo);
      }
      c.cpu.copy_h2d(cw, v.data(), 4 * n);
    }
    ParamRange gr = cr;
    gr.param = gp, gr.residual = static_cast<uint16_t*>(gres), gr.grad = gg;
    for (size_t k = 0; k < K; ++k) gr.slot[k] = gs[k], gr.scale[k] = static_cast<float*>(gsc[k]);
    opt->update(c.gpu, gr, h);
    c.cpu.free(cg);
    c.gpu.free(gg);
  }
  const Vec ref = down(c.cpu, cw, n);
  std::vector<uint16_t> ghi(n), glo(n);
  c.gpu.copy_d2h(ghi.data(), gp, 2 * n);
  c.gpu.copy_d2h(glo.data(), gres, 2 * n);
  size_t differ = 0, far = 0, lo_nonzero = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < n; ++i) {
    const optim::Compensated s = optim::compensated_split(ref[i]);
    differ += s.hi != ghi[i] || s.lo != glo[i];
    const double err = std::fabs(optim::compensated_value(ghi[i], glo[i]) - ref[i]),
                 bound = std::ldexp(std::max(std::fabs(ref[i]), h.lr), -15);
    far += err > bound;
    if (err / bound > worst_ratio) worst_ratio = err / bound, worst = i;
    lo_nonzero += glo[i] != 0;
  }
  // int8 and bf16 state run the rule's Fused arithmetic on both sides: the same bits. fp32 state keeps
  // each side's compiled arithmetic (the GPU contracts w - lr (u + wd w) into fused multiply-adds, the
  // host rounds each operation: an fp32 rounding or two apart, test_optimizer's master check), which moves
  // a truncated residual by its last bit now and then (Lion, whose whole update is that expression, in
  // about 2% of the elements over two steps) and, where an update cancels most of the value, leaves the
  // operands' rounding on a small result: none further than the residual's precision of the larger of
  // the value and the step (lr). Lion's direction is computed with separately rounded products on both
  // sides (optim/rules.hpp): contracted on the GPU, an interpolation the CPU rounds to exactly 0 (no step)
  // came out non-zero there (a whole step of lr) in 48 of 1,000,003 elements. The kernel's fp32-state
  // update is checked bit for bit against its host twin by tests/gpu/test_offload.cpp.
  const size_t allowed = t == optim::StateType::F32 ? n / 20 : 0;
  expect(differ <= allowed && far == 0,
         fmt("[%s] param and residual %s: %zu of %zu differ from the CPU's split master (%zu allowed), %zu beyond "
             "2^-15 of it (the furthest: element %zu, %.9g against %.9g, %.3g times the bound)", c.prec, sz.c_str(),
             differ, n, allowed, far, worst, double(optim::compensated_value(ghi[worst], glo[worst])),
             double(ref[worst]), worst_ratio));
  expect(lo_nonzero > n / 2, fmt("[%s] residual %s: only %zu of %zu nonzero", c.prec, sz.c_str(), lo_nonzero, n));
  for (void* q : {gp, gres}) c.gpu.free(q);
  for (void* q : gs) c.gpu.free(q);
  for (void* q : gsc) c.gpu.free(q);
  c.cpu.free(cw);
  for (void* q : cs) c.cpu.free(q);
  for (void* q : csc) c.cpu.free(q);
}

// ---- NCCL plumbing with a single rank (world 1): collectives are copies, events must not hang
class OneRank final : public HostComm {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  double sum(double x) override { return x; }
  long max(long x) override { return x; }
  void broadcast(void*, size_t, int) override {}
  [[noreturn]] void abort(int status) override { std::exit(status); }
  void* mpi_comm() override { return nullptr; }
};
void test_nccl_single(Ctx& c) {
  OneRank host;
  auto comm = make_nccl_communicator(host, c.gpu);
  const size_t n = 1000;
  const Vec x = c.rnd(n);
  void *a = up(c.gpu, x), *b = up(c.gpu, poison(n)), *g = up(c.gpu, poison(n));
  const DType t = c.gpu.act_dtype();
  comm->all_reduce_sum(a, n, t);
  comm->reduce_scatter_sum(a, b, n, t);
  comm->record(0);
  comm->wait(0);
  comm->all_gather(b, g, n, t);
  comm->join();
  check(fmt("[%s] nccl world=1 all_reduce/reduce_scatter/all_gather", c.prec), down(c.gpu, g, n), x, kF32Exact);
  for (void* p : {a, b, g}) c.gpu.free(p);
}

// One failing op (a library error, say) is reported and counted; the other checks still run.
template <class F>
void guarded(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    ++g_checks;
    ++g_failures;
    std::printf("FAIL exception: %s\n", e.what());
    ADD_FAILURE() << "exception: " << e.what();
  }
}

// The checks, one row per op and shapes: the Backend ops a row covers (their names in backend.hpp;
// run_op: device code run through the backend, an optimizer's update or the compensated split; none: a
// collective, outside the Backend) and the check at those shapes. A new Backend op gets its check by a row here: tests/test_op_table.py fails
// while an op of backend.hpp is named by no row. Rows run in order, each guarded.
struct OpCheck {
  std::vector<const char*> ops;
  std::function<void(Ctx&)> run;
};

std::vector<OpCheck> op_checks() {
  std::vector<OpCheck> t = {
      {{"convert", "add_inplace"}, [](Ctx& c) { test_conversions(c, 1000003); }},
      {{"encoder_fwd", "encoder_bwd"}, [](Ctx& c) { test_encoder(c, 2, 97, 257, 131); }},  // scalar path
      {{"encoder_fwd", "encoder_bwd"}, [](Ctx& c) { test_encoder(c, 4, 64, 768, 512); }},  // vector path, many repeated tokens
      {{"encoder_fwd", "encoder_bwd"}, [](Ctx& c) { test_encoder(c, 2, 97, 257, 131, false); }},  // no position embedding
      {{"encoder_fwd", "encoder_bwd"}, [](Ctx& c) { test_encoder(c, 4, 64, 768, 512, false); }},
  };
  // first (97 x 257), then while no wider launch has raised the kernel's shared-memory limit: bf16's
  // pipelined backward at 48 KB of dynamic shared memory plus its static barriers (GPT-2 tiny's width);
  // then an unaligned width with several vectors per thread (16 x 2052) and the pipelined backward with
  // many iterations a block, a partial last one, 16 rows a block (4099 x 768, 1031 x 1600)
  for (auto [N, C] : {std::pair{97, 257}, {333, 64}, {300, 768}, {64, 1600}, {16, 2052}, {4099, 768}, {1031, 1600}})
    for (const tests::NormVariant& v : tests::kNormVariants)  // every normalisation the model can use
      t.push_back({{"norm_fwd", "norm_bwd"}, [=](Ctx& c) { test_norm(c, v, N, C); }});
  auto matmul = [&](int N, int IC, int OC, bool bias, bool gelu) {
    t.push_back({{"matmul_fwd", "matmul_bwd"}, [=](Ctx& c) { test_matmul(c, N, IC, OC, bias, gelu); }});
  };
  matmul(97, 264, 136, true, false);
  matmul(97, 264, 136, true, true);   // fused GELU epilogues
  matmul(97, 257, 131, true, true);   // odd sizes: GELU/DGELU fall back to kernels
  matmul(256, 768, 3072, true, true);
  matmul(128, 768, 512, false, false);
  matmul(4133, 64, 1600, true, false);  // many rows: the bias gradient's unrolled loop
  for (auto [B, T, NH, HS] : {std::array{2, 97, 3, 64}, {2, 256, 4, 64}, {1, 128, 2, 32}})
    t.push_back({{"attention_fwd", "attention_bwd"}, [=](Ctx& c) { test_attention(c, B, T, NH, HS); }});
  // GPT-2 124M's and 1558M's heads (the last chunk of heads part full); one 16-byte group; odd sizes (plain path)
  for (auto [B, T, NH, HS] : {std::array{2, 97, 3, 64}, {4, 1024, 12, 64}, {1, 64, 25, 64}, {1, 16, 3, 16}, {1, 33, 2, 10}})
    t.push_back({{"rope"}, [=](Ctx& c) { test_rope(c, B, T, NH, HS); }});
  for (Activation act : tests::kActivations) {  // every activation the model can use
    t.push_back({{"activation_fwd", "activation_bwd"}, [=](Ctx& c) { test_activation(c, act, 1000003); }});
    if (act == Activation::gelu) continue;  // GELU's products are the rows above
    t.push_back({{"matmul_fwd", "matmul_bwd", "activation_fwd", "activation_bwd"},
                 [=](Ctx& c) { test_matmul(c, 97, 264, 136, true, true, act); }});
    t.push_back({{"matmul_fwd", "matmul_bwd", "activation_fwd", "activation_bwd"},
                 [=](Ctx& c) { test_matmul(c, 256, 768, 3072, true, true, act); }});
  }
  // a vocabulary in whole vectors; the scalar path; GPT-2's; a vector of real and padded columns, one of
  // padding only
  for (auto [N, V, Vp] : {std::array{97, 1000, 1024}, {33, 257, 259}, {16, 50257, 50304}, {41, 777, 792}})
    t.push_back({{"classifier"}, [=](Ctx& c) { test_classifier(c, N, V, Vp); }});
  t.push_back({{"normal_init"}, [](Ctx& c) { test_normal_init(c, (size_t(1) << 24) + 5, 1337, 7, 0.02f); }});
  t.push_back({{"normal_init"},
               [](Ctx& c) { test_normal_init(c, 1000003, 42, (uint64_t(1) << 32) + 3, 0.02f / std::sqrt(96.0f)); }});
  t.push_back({{"run_op"}, [](Ctx& c) { test_compensated_split(c, 1000003); }});
  for (size_t n : {size_t(1000003), size_t(7)})
    t.push_back({{"sum_squares"}, [=](Ctx& c) { test_sum_squares(c, n); }});
  for (const OptimizerInfo& info : optimizers()) {  // every rule there is (optim/rules.hpp), run_op's updates
    const std::string opt = info.name;
    t.push_back({{"run_op"}, [=](Ctx& c) { test_optimizer(c, opt.c_str(), 1000003, true); }});
    t.push_back({{"run_op"}, [=](Ctx& c) { test_optimizer(c, opt.c_str(), 100001, false); }});
    t.push_back({{"run_op"}, [=](Ctx& c) { test_optimizer_compensated(c, opt.c_str(), optim::StateType::F32, 1000003); }});
    for (optim::StateType st : {optim::StateType::BF16, optim::StateType::Int8}) {
      t.push_back({{"run_op"}, [=](Ctx& c) { test_optimizer_state(c, opt.c_str(), st, 1000003, true); }});
      t.push_back({{"run_op"}, [=](Ctx& c) { test_optimizer_state(c, opt.c_str(), st, 100001, false); }});
      t.push_back({{"run_op"}, [=](Ctx& c) { test_optimizer_compensated(c, opt.c_str(), st, 100001); }});
    }
  }
  t.push_back({{}, [](Ctx& c) { test_nccl_single(c); }});
  return t;
}

void run_checks(const char* prec) {
  BackendOptions opt;
  opt.act = std::string(prec) == "bf16" ? DType::BF16 : DType::F32;
  auto cpu = make_cpu_backend(BackendOptions{});
  auto gpu = make_cuda_backend(opt);
  Ctx c{*cpu, *gpu, std::string(prec) == "bf16", prec};
  std::printf("== %s on %s\n", prec, gpu->hardware().c_str());
  for (const OpCheck& row : op_checks()) guarded([&] { row.run(c); });
  // products of 10 GFLOP and more with the configuration search on: whatever configuration wins computes
  // the same products
  BackendOptions sopt = opt;
  sopt.matmul_search_s = 0.2;
  auto sgpu = make_cuda_backend(sopt);
  Ctx sc{*cpu, *sgpu, c.bf16, prec};
  guarded([&] { test_matmul(sc, 4096, 768, 3072, true, true); });
  guarded([&] { test_matmul(sc, 4096, 3072, 768, true, false); });
}

// ---- benchmark: each op at one layer's shapes. Host clock around `reps` back-to-back launches after a
// warm-up, synchronised at both ends (the tests build without the CUDA headers, so no device events).
struct Timer {
  Backend& b;
  template <class F>
  double ms(F&& f, int reps = 10) {
    f();  // warm-up: plan building, first touch
    b.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    b.synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  }
};

void fill_random(Backend& b, void* p, size_t n) {
  static Vec host;
  if (host.empty()) {
    host.resize(1 << 22);
    std::uniform_real_distribution<float> d(-1, 1);
    for (auto& x : host) x = d(g_rng);
  }
  float* tmp = static_cast<float*>(b.alloc(host.size() * 4));
  b.copy_h2d(tmp, host.data(), host.size() * 4);
  const size_t es = dtype_size(b.act_dtype());
  for (size_t off = 0; off < n; off += host.size())
    b.f32_to_act(static_cast<char*>(p) + off * es, tmp, std::min(host.size(), n - off));
  b.synchronize();
  b.free(tmp);
}

void bench(const char* label, int B, int T, int C, int NH, int L) {
  BackendOptions opt;
  opt.act = DType::BF16;
  auto gb = make_cuda_backend(opt);
  Backend& g = *gb;
  Timer tm{g};
  const int N = B * T, HS = C / NH, Vp = 50304, V = 50257;
  const size_t es = 2;
  auto A = [&](size_t n) {
    void* p = g.alloc(n * es);
    fill_random(g, p, n);
    return p;
  };
  void *x = A(size_t(N) * 4 * C), *y = A(size_t(N) * 4 * C), *z = A(size_t(N) * 4 * C), *pg = A(size_t(N) * 4 * C);
  void *w = A(size_t(4) * C * C), *dw = A(size_t(4) * C * C), *bias = A(4 * C), *dbias = A(4 * C);
  float *mean = (float*)g.alloc(N * 4), *rstd = (float*)g.alloc(N * 4), *lse = (float*)g.alloc(size_t(N) * NH * 4);
  const NormKind ln = NormKind::layernorm;
  g.norm_fwd(norm_fwd_op(ln, y, mean, rstd, nullptr, x, nullptr, w, bias, N, C));
  std::printf("\n== bench %s: B=%d T=%d C=%d NH=%d (per layer x%d)\n", label, B, T, C, NH, L);
  struct Row {
    const char* name;
    double ms;
    double flops;
    double bytes;
    int count;  // per step
  };
  std::vector<Row> rows;
  const double n = N, c = C;
  auto add = [&](const char* name, double ms, double flops, double bytes, int count) {
    rows.push_back({name, ms, flops, bytes, count});
    std::printf("%-28s %8.3f ms  %7.1f TFLOP/s  %7.0f GB/s  x%d\n", name, ms, flops / ms / 1e9, bytes / ms / 1e6,
                count);
  };
  add("layernorm_fwd", tm.ms([&] { g.norm_fwd(norm_fwd_op(ln, y, mean, rstd, nullptr, x, nullptr, w, bias, N, C)); }), 0, 2 * n * c * es, 2 * L);
  float* colsum = static_cast<float*>(g.alloc(size_t(C) * 4));
  add("layernorm_bwd", tm.ms([&] { g.norm_bwd(norm_bwd_op(ln, z, dw, dbias, y, x, w, mean, rstd, N, C, nullptr)); }), 0,
      4 * n * c * es, 1);
  add("layernorm_bwd +colsum", tm.ms([&] { g.norm_bwd(norm_bwd_op(ln, z, dw, dbias, y, x, w, mean, rstd, N, C, colsum)); }), 0,
      4 * n * c * es, 2 * L);
  add("residual_layernorm_fwd",
      tm.ms([&] { g.norm_fwd(norm_fwd_op(ln, y, mean, rstd, z, x, pg, w, bias, N, C)); }), 0, 4 * n * c * es, 2 * L);
  add("matmul_fwd qkv", tm.ms([&] { g.matmul_fwd(y, x, w, bias, N, C, 3 * C, nullptr); }), 2 * n * c * 3 * c, 0, L);
  add("matmul_fwd attproj", tm.ms([&] { g.matmul_fwd(y, x, w, bias, N, C, C, nullptr); }), 2 * n * c * c, 0, L);
  add("matmul_fwd fc+gelu", tm.ms([&] { g.matmul_fwd(y, x, w, bias, N, C, 4 * C, pg); }), 2 * n * c * 4 * c, 0, L);
  add("matmul_fwd fcproj", tm.ms([&] { g.matmul_fwd(y, x, w, bias, N, 4 * C, C, nullptr); }), 2 * n * c * 4 * c, 0,
      L);
  add("matmul_bwd qkv", tm.ms([&] { g.matmul_bwd(z, dw, dbias, y, x, w, N, C, 3 * C, nullptr, nullptr); }),
      4 * n * c * 3 * c, 0, L);
  add("matmul_bwd qkv (no dbias)",
      tm.ms([&] { g.matmul_bwd(z, dw, nullptr, y, x, w, N, C, 3 * C, nullptr, nullptr); }), 4 * n * c * 3 * c, 0, 0);
  add("matmul_bwd attproj (colsum)",
      tm.ms([&] { g.matmul_bwd(z, dw, dbias, y, x, w, N, C, C, nullptr, colsum); }), 4 * n * c * c, 0, L);
  add("matmul_bwd attproj (dbias)",
      tm.ms([&] { g.matmul_bwd(z, dw, dbias, y, x, w, N, C, C, nullptr, nullptr); }), 4 * n * c * c, 0, 0);
  add("matmul_bwd fc", tm.ms([&] { g.matmul_bwd(z, dw, dbias, y, x, w, N, C, 4 * C, nullptr, nullptr); }),
      4 * n * c * 4 * c, 0, L);
  add("matmul_bwd fc (no dbias)",
      tm.ms([&] { g.matmul_bwd(z, dw, nullptr, y, x, w, N, C, 4 * C, nullptr, nullptr); }), 4 * n * c * 4 * c, 0, 0);
  add("matmul_bwd fcproj+dgelu", tm.ms([&] { g.matmul_bwd(z, dw, dbias, y, x, w, N, 4 * C, C, pg, colsum); }),
      4 * n * c * 4 * c, 0, L);
  g.free(colsum);
  const double attn_f = 4.0 * B * NH * double(T) * T * HS / 2;  // causal: half of QK^T and PV
  add("attention_fwd", tm.ms([&] { g.attention_fwd(AttentionFwd{y, lse, x, B, T, NH, HS}); }), attn_f, 0, L);
  add("attention_bwd", tm.ms([&] { g.attention_bwd(AttentionBwd{z, y, x, y, lse, B, T, NH, HS}); }), 2.5 * attn_f, 0, L);
  add("add_inplace (N*C)", tm.ms([&] { g.add_inplace(y, x, size_t(N) * C); }), 0, 3 * n * c * es, 0);
  add("gelu_fwd (N*4C)", tm.ms([&] { g.activation_fwd(ActivationFwd{y, x, size_t(N) * 4 * C}); }), 0, 2 * n * 4 * c * es, 0);
  for (void* p : {x, y, z, pg, w, dw}) g.free(p);

  // embedding, LM head and loss, optimizer
  void* logits = A(size_t(N) * Vp);
  void *wte = A(size_t(Vp) * C), *dwte = A(size_t(Vp) * C), *wpe = A(size_t(T) * C), *dwpe = A(size_t(T) * C);
  void *h = A(size_t(N) * C), *dh = A(size_t(N) * C);
  std::vector<int> tok(N);
  std::uniform_int_distribution<int> d(0, V - 1);
  for (auto& t : tok) t = d(g_rng);
  int* gt = static_cast<int*>(g.alloc(N * 4));
  g.copy_h2d(gt, tok.data(), N * 4);
  float* losses = static_cast<float*>(g.alloc(N * 4));
  add("encoder_fwd", tm.ms([&] { g.encoder_fwd(EncoderFwd{h, gt, wte, wpe, B, T, C}); }), 0, 3 * n * c * es, 1);
  add("encoder_bwd", tm.ms([&] { g.encoder_bwd(EncoderBwd{dwte, dwpe, dh, gt, B, T, C}); }), 0, 2 * n * c * es, 1);
  add("matmul_fwd lm_head", tm.ms([&] { g.matmul_fwd(logits, h, wte, nullptr, N, C, Vp, nullptr); }),
      2 * n * c * Vp, 0, 1);
  add("classifier", tm.ms([&] { g.classifier(logits, losses, gt, N, V, Vp, 1.0f / N); }), 0, 2 * n * Vp * es, 1);
  add("matmul_bwd lm_head",
      tm.ms([&] { g.matmul_bwd(dh, dwte, nullptr, logits, h, wte, N, C, Vp, nullptr, nullptr); }),
      4 * n * c * Vp, 0, 1);
  for (void* p : {logits, h, dh}) g.free(p);
  const size_t P = size_t(12) * C * C * L + size_t(Vp) * C;  // parameters, roughly
  void* param = A(P);
  void* grad = A(P);
  float *master = (float*)g.alloc(P * 4), *m = (float*)g.alloc(P * 4), *v = (float*)g.alloc(P * 4);
  g.zero(m, P * 4);
  g.zero(v, P * 4);
  g.act_to_f32(master, param, P);
  ParamRange aw;
  aw.param = param, aw.master = master, aw.grad = grad, aw.slot[0] = m, aw.slot[1] = v, aw.n = P, aw.decay = true;
  OptimizerHyper ah;
  ah.lr = 1e-4f;
  const auto adamw = make_optimizer("adamw", true);
  add("adamw (all params)", tm.ms([&] { adamw->update(g, aw, ah); }, 3), 0, P * (2 + 2 + 24.0), 1);
  add("sum_squares (all grads)", tm.ms([&] { g.sum_squares(SumSquares{grad, P}); }, 3), 0, P * 2.0, 1);
  double total = 0, total_flops = 0;
  for (auto& r : rows) total += r.ms * r.count, total_flops += r.flops * r.count;
  std::printf("%-28s %8.1f ms per step (sum of the ops above, no overlap; %.1f TFLOP/s, peak mem %.1f GB)\n",
              "estimated step", total, total_flops / total / 1e9, g.peak_bytes() / 1e9);
}

}  // namespace

TEST(GpuOps, bf16_against_cpu) { run_checks("bf16"); }
TEST(GpuOps, fp32_against_cpu) { run_checks("fp32"); }

int main(int argc, char** argv) {
  bool do_bench = false;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--bench") do_bench = true;
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new gpt::tests::NeedsGpu);
  const int rc = RUN_ALL_TESTS();
  std::printf("\n%d of %d checks failed\n", g_failures, g_checks);
  if (do_bench && gpt::cuda_device_count() > 0) {
    guarded([] { bench("GPT-2 124M", 64, 1024, 768, 12, 12); });
    guarded([] { bench("GPT-2 1558M", 16, 1024, 1600, 25, 48); });
  }
  return rc;
}
