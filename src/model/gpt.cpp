#include "model/gpt.hpp"
#include "model/gpt_acts.hpp"

#include <algorithm>
#include <cmath>

namespace gpt {

// ---------------------------------------------------------------------------------------------------
// Activations. Per layer (L of each unless shared by recompute):
//   ln1 (B,T,C), ln1 mean/rstd (B,T) f32, qkv (B,T,3C), atty (B,T,C), lse (B,NH,T) f32,
//   res2 (B,T,C) = residual after attention, ln2 (B,T,C), ln2 mean/rstd, fch (B,T,4C) pre-GELU,
//   fch_gelu (B,T,4C), res3 (B,T,C) = residual after the MLP.
// recompute >= 1 keeps one shared fch_gelu; recompute 2 also one shared ln1 and ln2.
// FP8 (gpt_fp8.cpp): ln1, ln2 are FP8 bytes (N,C); fch_gelu FP8 transposed (4C,N); atty_t (C,N) FP8 besides
// atty; the layer's weights in FP8 with their transposes (w8); FP8 scratch for the products' operands.
namespace {
constexpr size_t kMaxChunkRows = 8192;  // lm-head rows per chunk: bounds the logits buffer
}  // namespace

ActivationBytes activation_bytes(const ModelDims& d, int B, int T, int recompute, DType act, bool fp8) {
  const size_t BT = size_t(B) * T, C = d.n_embd, L = d.n_layer, NH = d.n_head, Vp = d.padded_vocab;
  const size_t e = dtype_size(act), f = 4, q = fp8 ? 1 : e;  // q: the block inputs' element size
  const size_t chunk = std::min(BT, kMaxChunkRows);
  const size_t ln_layers = recompute >= 2 ? 1 : L, gelu_layers = recompute >= 1 ? 1 : L;
  ActivationBytes r;
  r.stored = e * BT * C                                   // encoded
             + L * e * BT * (3 * C + C + C + 4 * C + C)   // qkv atty res2 fch res3
             + ln_layers * q * BT * 2 * C                 // ln1 ln2
             + gelu_layers * q * BT * 4 * C               // fch_gelu
             + L * f * (4 * BT + NH * BT)                 // ln means/rstds, lse
             + e * BT * C + f * 2 * BT;                   // lnf + stats
  r.scratch = e * chunk * Vp + f * BT + 4 * 2 * BT       // logits, losses, tokens, targets
              + e * BT * C * 5 + e * BT * 4 * C           // scratch_c, dres, dlnf, dtmp, datty, dbig
              + f * C;                                    // dres_colsum
  if (fp8) {
    r.stored += L * BT * C + L * 24 * C * C;              // atty_t, the FP8 weights
    r.scratch += 3 * BT * 4 * C + f * 4 * C;              // q_in, q_dout_t, q_inp_t, colsum_big
  }
  return r;
}

GPT::GPT(const ModelDims& d, const ParamLayout& layout, Backend& be, int B, int T, int recompute, Fp8Recipe* fp8)
    : d_(d), layout_(layout), be_(be), B_(B), T_(T), recompute_(recompute), fp8_(fp8), a_(new Acts) {
  const size_t BT = size_t(B) * T, C = d.n_embd, L = d.n_layer, NH = d.n_head, Vp = d.padded_vocab;
  const size_t e = dtype_size(be.act_dtype()), q = fp8 ? 1 : e;
  chunk_rows_ = int(std::min(BT, kMaxChunkRows));
  auto A = [&](size_t bytes) {
    void* p = be_.alloc(bytes);
    a_->owned.push_back(p);
    return p;
  };
  auto F = [&](size_t n) { return static_cast<float*>(A(n * 4)); };
  const size_t before = be.bytes_in_use();
  try {
  a_->encoded = A(e * BT * C);
  void* shared_ln1 = recompute >= 2 ? A(q * BT * C) : nullptr;
  void* shared_ln2 = recompute >= 2 ? A(q * BT * C) : nullptr;
  void* shared_gelu = recompute >= 1 ? A(q * BT * 4 * C) : nullptr;
  for (size_t l = 0; l < L; ++l) {
    a_->ln1.push_back(shared_ln1 ? shared_ln1 : A(q * BT * C));
    a_->ln1_mean.push_back(F(BT));
    a_->ln1_rstd.push_back(F(BT));
    a_->qkv.push_back(A(e * BT * 3 * C));
    a_->atty.push_back(A(e * BT * C));
    a_->lse.push_back(F(NH * BT));
    a_->res2.push_back(A(e * BT * C));
    a_->ln2.push_back(shared_ln2 ? shared_ln2 : A(q * BT * C));
    a_->ln2_mean.push_back(F(BT));
    a_->ln2_rstd.push_back(F(BT));
    a_->fch.push_back(A(e * BT * 4 * C));
    a_->fch_gelu.push_back(shared_gelu ? shared_gelu : A(q * BT * 4 * C));
    a_->res3.push_back(A(e * BT * C));
    if (fp8) {
      a_->atty_t.push_back(A(BT * C));
      a_->w8.push_back(A(24 * C * C));
      a_->w8_key.emplace_back(0, -1);
    }
  }
  a_->lnf = A(e * BT * C);
  a_->lnf_mean = F(BT);
  a_->lnf_rstd = F(BT);
  stored_bytes_ = be.bytes_in_use() - before;
  a_->logits = A(e * size_t(chunk_rows_) * Vp);
  a_->losses = F(BT);
  a_->tokens = static_cast<int*>(A(4 * BT));
  a_->targets = static_cast<int*>(A(4 * BT));
  a_->scratch_c = A(e * BT * C);
  a_->dres = A(e * BT * C);
  a_->dlnf = A(e * BT * C);
  a_->dtmp = A(e * BT * C);
  a_->datty = A(e * BT * C);
  a_->dbig = A(e * BT * 4 * C);
  a_->dres_colsum = F(C);
  if (fp8) {
    a_->q_in = A(BT * 4 * C);
    a_->q_dout_t = A(BT * 4 * C);
    a_->q_inp_t = A(BT * 4 * C);
    a_->colsum_big = F(4 * C);
  }
  scratch_bytes_ = be.bytes_in_use() - before - stored_bytes_;
  } catch (...) {  // out of memory part-way: give back what was taken
    for (void* p : a_->owned) be_.free(p);
    delete a_;
    throw;
  }
  losses_host_.resize(BT);
}

GPT::~GPT() {
  for (void* p : a_->owned) be_.free(p);
  delete a_;
}

GPT::View GPT::params_of(ParamStore& ps, int b) const {
  return {&layout_.bucket(b), static_cast<char*>(const_cast<void*>(ps.params(b))), dtype_size(be_.act_dtype())};
}
GPT::View GPT::grads_of(ParamStore& ps, int b) const {
  return {&layout_.bucket(b), static_cast<char*>(ps.grads(b)), dtype_size(be_.act_dtype())};
}

void GPT::trunk(ParamStore& ps, const int* tokens, bool train) {
  const int B = B_, T = T_, C = d_.n_embd, L = d_.n_layer;
  const int N = B * T;
  Acts& a = *a_;
  be_.copy_h2d(a.tokens, tokens, sizeof(int) * N);

  const int E = 0;
  ps.prefetch(layout_.layer_bucket(0));
  const View we = params_of(ps, E);
  be_.encoder_fwd(a.encoded, a.tokens, we(P::wte), we(P::wpe), B, T, C);
  for (int l = 0; l < L; ++l) {
    const int b = layout_.layer_bucket(l);
    if (l + 1 < L) ps.prefetch(b + 1);
    else ps.prefetch(layout_.final_bucket());
    const View w = params_of(ps, b);
    if (l == 0 && fp8_)
      be_.fp8()->layernorm_fwd(q(0, Fp8Recipe::kQkv, Fp8Recipe::kInput, a.ln1[0], train), a.ln1_mean[0],
                               a.ln1_rstd[0], nullptr, a.encoded, nullptr, w(P::ln1w), w(P::ln1b), N, C);
    else if (l == 0)
      be_.layernorm_fwd(a.ln1[0], a.ln1_mean[0], a.ln1_rstd[0], a.encoded, w(P::ln1w), w(P::ln1b), N, C);
    if (fp8_)
      block_fwd_fp8(ps, l, w, train);
    else
      block_fwd(l, w);
    next_layernorm(ps, l, train);
  }
}

// attention, residual, ln2, MLP: ln1[l] -> scratch_c (the MLP's output before its residual add)
void GPT::block_fwd(int l, const View& w) {
  const int B = B_, T = T_, C = d_.n_embd, NH = d_.n_head, HS = d_.head_dim();
  const int N = B * T;
  Acts& a = *a_;
  be_.matmul_fwd(a.qkv[l], a.ln1[l], w(P::qkvw), w(P::qkvb), N, C, 3 * C, nullptr);
  be_.attention_fwd(a.atty[l], a.lse[l], a.qkv[l], B, T, NH, HS);
  be_.matmul_fwd(a.scratch_c, a.atty[l], w(P::attprojw), w(P::attprojb), N, C, C, nullptr);
  const void* res_in = l == 0 ? a.encoded : a.res3[l - 1];
  be_.residual_layernorm_fwd(a.res2[l], a.ln2[l], a.ln2_mean[l], a.ln2_rstd[l], res_in, a.scratch_c, w(P::ln2w),
                             w(P::ln2b), N, C);
  be_.matmul_fwd(a.fch_gelu[l], a.ln2[l], w(P::fcw), w(P::fcb), N, C, 4 * C, a.fch[l]);
  be_.matmul_fwd(a.scratch_c, a.fch_gelu[l], w(P::fcprojw), w(P::fcprojb), N, 4 * C, C, nullptr);
}

// res3 = res2 + mlp; then the next LayerNorm on it: layer l+1's ln1 (FP8 when its products are), or the
// final one (bf16: the classifier's products stay bf16)
void GPT::next_layernorm(ParamStore& ps, int l, bool train) {
  const int C = d_.n_embd, N = B_ * T_, L = d_.n_layer;
  Acts& a = *a_;
  const int nb = l + 1 < L ? layout_.layer_bucket(l) + 1 : layout_.final_bucket();
  const View wn = params_of(ps, nb);
  if (l + 1 < L && fp8_) {
    be_.fp8()->layernorm_fwd(q(l + 1, Fp8Recipe::kQkv, Fp8Recipe::kInput, a.ln1[l + 1], train), a.ln1_mean[l + 1],
                             a.ln1_rstd[l + 1], a.res3[l], a.res2[l], a.scratch_c, wn(P::ln1w), wn(P::ln1b), N, C);
  } else if (l + 1 < L) {
    be_.residual_layernorm_fwd(a.res3[l], a.ln1[l + 1], a.ln1_mean[l + 1], a.ln1_rstd[l + 1], a.res2[l], a.scratch_c,
                               wn(P::ln1w), wn(P::ln1b), N, C);
  } else {
    be_.residual_layernorm_fwd(a.res3[l], a.lnf, a.lnf_mean, a.lnf_rstd, a.res2[l], a.scratch_c, wn(P::lnfw),
                               wn(P::lnfb), N, C);
  }
}

void GPT::logits_row(ParamStore& ps, const int* tokens, int row, float* out) {
  const int C = d_.n_embd, Vp = d_.padded_vocab;
  trunk(ps, tokens, false);
  const size_t e = dtype_size(be_.act_dtype());
  const void* x = static_cast<const char*>(a_->lnf) + e * size_t(row) * C;
  be_.matmul_fwd(a_->logits, x, params_of(ps, 0)(P::wte), nullptr, 1, C, Vp, nullptr);
  float* tmp = static_cast<float*>(be_.alloc(4 * size_t(Vp)));
  be_.act_to_f32(tmp, a_->logits, Vp);
  be_.copy_d2h(out, tmp, 4 * size_t(d_.vocab_size));
  be_.free(tmp);
}

float GPT::forward(ParamStore& ps, const int* tokens, const int* targets, bool train, float dloss) {
  const int C = d_.n_embd, N = B_ * T_, V = d_.vocab_size, Vp = d_.padded_vocab;
  const int E = 0;
  Acts& a = *a_;
  trunk(ps, tokens, train);
  be_.copy_h2d(a.targets, targets, sizeof(int) * N);
  // lm head (tied to wte), chunk by chunk: logits -> losses (and, training, dlogits -> dlnf, dwte)
  const void* wte = params_of(ps, E)(P::wte);
  void* dwte = train ? grads_of(ps, E)(P::wte) : nullptr;
  const size_t e = dtype_size(be_.act_dtype());
  for (int r0 = 0; r0 < N; r0 += chunk_rows_) {
    const int n = std::min(chunk_rows_, N - r0);
    const void* x = static_cast<const char*>(a.lnf) + e * size_t(r0) * C;
    be_.matmul_fwd(a.logits, x, wte, nullptr, n, C, Vp, nullptr);
    be_.classifier(a.logits, a.losses + r0, a.targets + r0, n, V, Vp, train ? dloss : 0.0f);
    if (train) {
      void* dx = static_cast<char*>(a.dlnf) + e * size_t(r0) * C;
      be_.matmul_bwd(dx, dwte, nullptr, a.logits, x, wte, n, C, Vp, nullptr, nullptr);
    }
  }
  be_.copy_d2h(losses_host_.data(), a.losses, sizeof(float) * N);
  double s = 0;
  for (int i = 0; i < N; ++i) s += losses_host_[i];
  return float(s / N);
}

void GPT::backward(ParamStore& ps) {
  const int B = B_, T = T_, C = d_.n_embd, L = d_.n_layer;
  const int N = B * T;
  Acts& a = *a_;
  const size_t e = dtype_size(be_.act_dtype());
  const int fb = layout_.final_bucket(), E = 0;

  be_.zero(a.dres, e * size_t(N) * C);
  ps.prefetch(layout_.layer_bucket(L - 1));
  // Each LayerNorm backward adds its branch into dres and sums dres's columns: the bias gradient of the
  // projection whose output was the residual stream there (layer l's fcproj, then its attproj).
  const View gf = grads_of(ps, fb);
  be_.layernorm_bwd(a.dres, gf(P::lnfw), gf(P::lnfb), a.dlnf, a.res3[L - 1], params_of(ps, fb)(P::lnfw), a.lnf_mean,
                    a.lnf_rstd, N, C, a.dres_colsum);
  ps.grads_done(fb);
  for (int l = L - 1; l >= 0; --l) {
    const int b = layout_.layer_bucket(l);
    if (l > 0) ps.prefetch(b - 1);
    else ps.prefetch(E);
    const View w = params_of(ps, b), g = grads_of(ps, b);
    if (fp8_)
      block_bwd_fp8(l, w, g);
    else
      block_bwd(l, w, g);
    ps.grads_done(b);
  }
  const View ge = grads_of(ps, E);
  be_.encoder_bwd(ge(P::wte), ge(P::wpe), a.dres, a.tokens, B, T, C);
  ps.grads_done(E);
}

// dres holds d(loss)/d(res3[l]) and dres_colsum its column sums; after: d/d(the layer's input residual)
void GPT::block_bwd(int l, const View& w, const View& g) {
  const int B = B_, T = T_, C = d_.n_embd, NH = d_.n_head, HS = d_.head_dim();
  const int N = B * T;
  Acts& a = *a_;
  // MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
  if (recompute_ >= 1) be_.gelu_fwd(a.fch_gelu[l], a.fch[l], size_t(N) * 4 * C);
  be_.matmul_bwd(a.dbig, g(P::fcprojw), g(P::fcprojb), a.dres, a.fch_gelu[l], w(P::fcprojw), N, 4 * C, C, a.fch[l],
                 a.dres_colsum);
  if (recompute_ >= 2)
    be_.layernorm_fwd(a.ln2[l], a.ln2_mean[l], a.ln2_rstd[l], a.res2[l], w(P::ln2w), w(P::ln2b), N, C);
  be_.matmul_bwd(a.dtmp, g(P::fcw), g(P::fcb), a.dbig, a.ln2[l], w(P::fcw), N, C, 4 * C, nullptr, nullptr);
  be_.layernorm_bwd(a.dres, g(P::ln2w), g(P::ln2b), a.dtmp, a.res2[l], w(P::ln2w), a.ln2_mean[l], a.ln2_rstd[l], N,
                    C, a.dres_colsum);
  // dres holds d/d(res2[l]). Attention: res2 = res_in + attproj(attn(qkv(ln1(res_in))))
  be_.matmul_bwd(a.datty, g(P::attprojw), g(P::attprojb), a.dres, a.atty[l], w(P::attprojw), N, C, C, nullptr,
                 a.dres_colsum);
  be_.attention_bwd(a.dbig, a.datty, a.qkv[l], a.atty[l], a.lse[l], B, T, NH, HS);
  const void* res_in = l == 0 ? a.encoded : a.res3[l - 1];
  if (recompute_ >= 2)
    be_.layernorm_fwd(a.ln1[l], a.ln1_mean[l], a.ln1_rstd[l], res_in, w(P::ln1w), w(P::ln1b), N, C);
  be_.matmul_bwd(a.dtmp, g(P::qkvw), g(P::qkvb), a.dbig, a.ln1[l], w(P::qkvw), N, C, 3 * C, nullptr, nullptr);
  be_.layernorm_bwd(a.dres, g(P::ln1w), g(P::ln1b), a.dtmp, res_in, w(P::ln1w), a.ln1_mean[l], a.ln1_rstd[l], N, C,
                    l > 0 ? a.dres_colsum : nullptr);
}

}  // namespace gpt
