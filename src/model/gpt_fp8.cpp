// A layer's block with its four products in FP8 (training.precision fp8; model/fp8_recipe.hpp).
//
// Forward: ln1 and ln2 are written as FP8 by the LayerNorm kernels; attention's output and GELU's are
// cast in one pass each, row-major for the next product and transposed for the weight gradient. The
// weights are cast (with their transposes) once per change of the parameters or the scales.
// Backward: each product's output gradient is cast once, row-major for the input gradient and
// transposed for the weight gradient, summing the bias gradient on the way; the fc gradient's cast applies
// GELU's derivative too (cuBLASLt's DGELU epilogue on FP8 operands measured 5x slower than the plain
// product on an H200: 19.1 against 3.7 ms a step for GPT-2 124M's fc projections, B=64). The weight-gradient products take their inputs transposed: the stored
// ln1/ln2 bytes are transposed here, attention's and GELU's were stored transposed by the forward.
#include "model/gpt.hpp"
#include "model/gpt_acts.hpp"

namespace gpt {

namespace {
using R = Fp8Recipe;
// (in, out) features of each product
struct Shape {
  size_t in, out;
};
Shape shape_of(R::Product p, size_t C) {
  switch (p) {
    case R::kQkv: return {C, 3 * C};
    case R::kAttProj: return {C, C};
    case R::kFc: return {C, 4 * C};
    default: return {4 * C, C};
  }
}
// bytes of the weight copies before product p's (each weight and its transpose)
size_t w8_offset(R::Product p, size_t C) {
  size_t off = 0;
  for (int i = 0; i < p; ++i) {
    const Shape s = shape_of(R::Product(i), C);
    off += 2 * s.in * s.out;
  }
  return off;
}
P weight_of(R::Product p) {
  switch (p) {
    case R::kQkv: return P::qkvw;
    case R::kAttProj: return P::attprojw;
    case R::kFc: return P::fcw;
    default: return P::fcprojw;
  }
}
Fp8Tensor with_data(Fp8Tensor t, void* data) {
  t.data = data;
  return t;
}
}  // namespace

Fp8Tensor GPT::weight_fp8(int l, Fp8Recipe::Product p, bool transposed) const {
  const size_t C = d_.n_embd;
  const Shape s = shape_of(p, C);
  char* base = static_cast<char*>(a_->w8[l]) + w8_offset(p, C) + (transposed ? s.in * s.out : 0);
  return q(l, p, R::kWeight, base);
}

void GPT::cast_weights_fp8(ParamStore& ps, int l, const View& w) {
  const std::pair<uint64_t, int64_t> key{ps.params_version(), fp8_->steps()};
  if (a_->w8_key[l] == key) return;
  const size_t C = d_.n_embd;
  for (int i = 0; i < R::kProducts; ++i) {
    const R::Product p = R::Product(i);
    const Shape s = shape_of(p, C);
    // w (out, in) -> FP8 (out, in) and transposed (in, out); the amax of the weights is recorded every
    // time (the same values however often they are cast)
    be_.fp8()->cast(weight_fp8(l, p, false), weight_fp8(l, p, true).data, w(weight_of(p)), nullptr, nullptr,
                    int(s.out), int(s.in));
  }
  a_->w8_key[l] = key;
}

void GPT::block_fwd_fp8(ParamStore& ps, int l, const View& w, bool train) {
  const int B = B_, T = T_, C = d_.n_embd, NH = d_.n_head, HS = d_.head_dim();
  const int N = B * T;
  Acts& a = *a_;
  Fp8Ops& f = *be_.fp8();
  cast_weights_fp8(ps, l, w);
  f.matmul_fwd(a.qkv[l], q(l, R::kQkv, R::kInput, a.ln1[l], train), weight_fp8(l, R::kQkv, false), w(P::qkvb), N, C,
               3 * C, nullptr);
  be_.attention_fwd(a.atty[l], a.lse[l], a.qkv[l], B, T, NH, HS);
  // attention's output: row-major for the projection, transposed (kept) for its weight gradient
  const Fp8Tensor att = q(l, R::kAttProj, R::kInput, a.q_in, train);
  f.cast(att, train ? a.atty_t[l] : nullptr, a.atty[l], nullptr, nullptr, N, C);
  f.matmul_fwd(a.scratch_c, att, weight_fp8(l, R::kAttProj, false), w(P::attprojb), N, C, C, nullptr);
  const void* res_in = l == 0 ? a.encoded : a.res3[l - 1];
  const Fp8Tensor ln2 = q(l, R::kFc, R::kInput, a.ln2[l], train);
  f.layernorm_fwd(ln2, a.ln2_mean[l], a.ln2_rstd[l], a.res2[l], res_in, a.scratch_c, w(P::ln2w), w(P::ln2b), N, C);
  // fc with GELU fused: pre-activation kept in fch, GELU's output (bf16, in dbig) cast once
  f.matmul_fwd(a.dbig, ln2, weight_fp8(l, R::kFc, false), w(P::fcb), N, C, 4 * C, a.fch[l]);
  const Fp8Tensor gelu = q(l, R::kFcProj, R::kInput, a.q_in, train);
  f.cast(gelu, train && recompute_ < 1 ? a.fch_gelu[l] : nullptr, a.dbig, nullptr, nullptr, N, 4 * C);
  f.matmul_fwd(a.scratch_c, gelu, weight_fp8(l, R::kFcProj, false), w(P::fcprojb), N, 4 * C, C, nullptr);
}

// As block_bwd: dres holds d(loss)/d(res3[l]) and dres_colsum its column sums.
void GPT::block_bwd_fp8(int l, const View& w, const View& g) {
  const int B = B_, T = T_, C = d_.n_embd, NH = d_.n_head, HS = d_.head_dim();
  const int N = B * T;
  Acts& a = *a_;
  Fp8Ops& f = *be_.fp8();
  // product p's weight gradient and input gradient from its output gradient `dout` (times gelu'(gelu_in)
  // when given; cast here, with its column sums into dsum when given) and its input, transposed, in inp_t
  auto product_bwd = [&](R::Product p, void* dinp, const void* dout, const void* gelu_in, float* dsum,
                         void* inp_t) {
    const Shape s = shape_of(p, size_t(C));
    const int in = int(s.in), out = int(s.out);
    const Fp8Tensor d = q(l, p, R::kGrad, a.q_in);
    f.cast(d, a.q_dout_t, dout, gelu_in, dsum, N, out);
    f.matmul_dinp(dinp, d, weight_fp8(l, p, true), N, in, out, nullptr);
    f.matmul_dw(g(weight_of(p)), with_data(d, a.q_dout_t), q(l, p, R::kInput, inp_t), N, in, out);
  };
  // MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
  if (recompute_ >= 1) {  // GELU's output again, cast with the forward's scale: the same bytes
    be_.gelu_fwd(a.dbig, a.fch[l], size_t(N) * 4 * C);
    f.cast(q(l, R::kFcProj, R::kInput, nullptr, false), a.fch_gelu[l], a.dbig, nullptr, nullptr, N, 4 * C);
  }
  product_bwd(R::kFcProj, a.dbig, a.dres, nullptr, nullptr, a.fch_gelu[l]);
  f.add_sums(g(P::fcprojb), a.dres_colsum, C);
  if (recompute_ >= 2)
    f.layernorm_fwd(q(l, R::kFc, R::kInput, a.ln2[l], false), a.ln2_mean[l], a.ln2_rstd[l], nullptr, a.res2[l],
                    nullptr, w(P::ln2w), w(P::ln2b), N, C);
  f.transpose(a.q_inp_t, a.ln2[l], N, C);
  product_bwd(R::kFc, a.dtmp, a.dbig, a.fch[l], a.colsum_big, a.q_inp_t);  // dfch = dgelu * gelu'(fch)
  f.add_sums(g(P::fcb), a.colsum_big, 4 * C);
  be_.layernorm_bwd(a.dres, g(P::ln2w), g(P::ln2b), a.dtmp, a.res2[l], w(P::ln2w), a.ln2_mean[l], a.ln2_rstd[l], N,
                    C, a.dres_colsum);
  // Attention: res2 = res_in + attproj(attn(qkv(ln1(res_in))))
  product_bwd(R::kAttProj, a.datty, a.dres, nullptr, nullptr, a.atty_t[l]);
  f.add_sums(g(P::attprojb), a.dres_colsum, C);
  be_.attention_bwd(a.dbig, a.datty, a.qkv[l], a.atty[l], a.lse[l], B, T, NH, HS);
  const void* res_in = l == 0 ? a.encoded : a.res3[l - 1];
  if (recompute_ >= 2)
    f.layernorm_fwd(q(l, R::kQkv, R::kInput, a.ln1[l], false), a.ln1_mean[l], a.ln1_rstd[l], nullptr, res_in,
                    nullptr, w(P::ln1w), w(P::ln1b), N, C);
  f.transpose(a.q_inp_t, a.ln1[l], N, C);
  product_bwd(R::kQkv, a.dtmp, a.dbig, nullptr, a.colsum_big, a.q_inp_t);
  f.add_sums(g(P::qkvb), a.colsum_big, 3 * C);
  be_.layernorm_bwd(a.dres, g(P::ln1w), g(P::ln1b), a.dtmp, res_in, w(P::ln1w), a.ln1_mean[l], a.ln1_rstd[l], N, C,
                    l > 0 ? a.dres_colsum : nullptr);
}

}  // namespace gpt
