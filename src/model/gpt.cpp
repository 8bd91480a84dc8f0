#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>

namespace gpt {

// ---------------------------------------------------------------------------------------------------
// Activations. Per layer (L of each unless shared by recompute): BlockActs (model/block.hpp), and
// res3 (B,T,C) = the residual after the MLP.
// recompute >= 1 keeps one shared fch_gelu; recompute 2 also one shared ln1 and ln2; recompute 3 keeps
// only the residual stream into each block (encoded, res3) and one shared BlockActs, which each block's
// backward fills again by recomputing the block's forward.
// FP8 products (each where training.fp8_layers and fp8_products make it FP8): ln1 (qkv's input), ln2 (fc's)
// are FP8 bytes (N,C); fch_gelu (fcproj's) FP8 (4C,N) transposed ((N,4C) from fc's epilogue); atty_t (C,N)
// FP8 besides atty (attproj's); the FP8 products' weights with their transposes; FP8 scratch for the
// products' operands.
// FP8 classifier: lnf is FP8 bytes (N,C); wte in FP8 with its transpose; scratch for the chunk's logit
// gradient (chunk,Vp) and its lnf rows transposed (C,chunk) (the gradient's transpose reuses the logits).
namespace {
constexpr size_t kNoWpe = ~size_t(0);  // wpe_ of a model without a learned position embedding

std::vector<Block> make_blocks(const ParamLayout& layout, const PrecisionPolicy& policy, Fp8Scaling* fp8) {
  std::vector<Block> blocks;
  blocks.reserve(layout.dims().n_layer);
  for (int l = 0; l < layout.dims().n_layer; ++l)
    blocks.emplace_back(layout, l, LayerPrecision{policy.layer_fp8(l) ? fp8 : nullptr, policy.fp8_gelu_epilogue},
                        policy.fp8_products);
  return blocks;
}
}  // namespace

struct GPT::Acts {
  void* encoded;                       // (B,T,C)
  std::vector<BlockActs> block;
  std::vector<void*> res3;             // (B,T,C) per layer
  void* lnf;                           // (B,T,C); FP8 bytes with an FP8 classifier
  float *lnf_mean, *lnf_rstd;          // (B,T)
  void* logits;                        // (chunk, Vp)
  void* dlogits_q = nullptr;           // (chunk, Vp) FP8 classifier: the logits' gradient, bytes
  void* lnf_t = nullptr;               // (C, chunk) FP8 classifier: the chunk's lnf transposed, bytes
  float* losses;                       // (B,T)
  int *tokens, *targets;               // (B,T)
  void* scratch_c;                     // (B,T,C): attproj / fcproj outputs before the residual add
  // backward
  void *dres, *dlnf, *dtmp, *datty;    // (B,T,C)
  float* dres_colsum;                  // (C): column sums of dres, the next projection's bias gradient
  void* dbig;                          // (B,T,4C): dfch or dqkv (FP8: also the GELU output before its cast)
  std::vector<void*> owned;
};

size_t fp8_scaled_tensors(const ModelSpec& spec) {
  const ModelDims& d = spec.dims;
  const PrecisionPolicy& p = spec.precision;
  size_t n = p.fp8_classifier ? 3 : 0;
  for (int q = 0; q < 4; ++q) n += size_t(3) * p.product_layer_count(d.n_layer, Product(q));
  return n;
}

ActivationBytes activation_bytes(const ModelSpec& spec, int B, int T, int recompute, DType act, int chunk_rows) {
  const ModelDims& d = spec.dims;
  const PrecisionPolicy& p = spec.precision;
  const bool fp8 = p.fp8_linear;
  const size_t BT = size_t(B) * T, C = d.n_embd, L = d.n_layer, NH = d.n_head, Vp = d.padded_vocab;
  const size_t e = dtype_size(act), f = 4;
  // layers whose product x is FP8; the product's input bytes an element summed over the layers (one in the
  // layers where it is FP8), or of a buffer the layers share (recompute), which holds the widest
  auto n8 = [&](Product x) { return size_t(p.product_layer_count(d.n_layer, x)); };
  auto q_sum = [&](Product x) { return n8(x) + (L - n8(x)) * e; };
  auto q_shared = [&](Product x) { return p.all_layers_product_fp8(x) ? 1 : e; };
  auto q_at = [&](int level, Product x) { return recompute >= level ? q_shared(x) : q_sum(x); };
  const size_t weights8 = (3 * n8(Product::qkv) + n8(Product::attproj) + 4 * n8(Product::fc) + 4 * n8(Product::fcproj)) *
                          C * C;  // the FP8 products' weights, elements
  const size_t q_lnf = p.fp8_classifier ? 1 : e;              // the classifier's input's
  const size_t chunk = std::min(BT, size_t(chunk_rows));  // lm-head rows per chunk: the logits buffer's
  const size_t act_layers = recompute >= 3 ? 1 : L;      // the rest of BlockActs
  ActivationBytes r;
  r.stored = e * BT * C                                   // encoded
             + L * e * BT * C                             // res3
             + act_layers * e * BT * (3 * C + C + C + 4 * C)  // qkv atty res2 fch
             + (q_at(2, Product::qkv) + q_at(2, Product::fc)) * BT * C  // ln1 ln2
             + q_at(1, Product::fcproj) * BT * 4 * C      // fch_gelu
             + act_layers * f * (4 * BT + NH * BT)        // ln means/rstds, lse
             + q_lnf * BT * C + f * 2 * BT;               // lnf + stats
  r.scratch = e * chunk * Vp + f * BT + 4 * 2 * BT       // logits, losses, tokens, targets
              + e * BT * C * 5 + e * BT * 4 * C           // scratch_c, dres, dlnf, dtmp, datty, dbig
              + f * C;                                    // dres_colsum
  if (fp8) {
    const size_t atty_t = recompute >= 3 ? size_t(n8(Product::attproj) > 0) : n8(Product::attproj);
    // one FP8 layer's weights (each FP8 layer has the same products)
    const size_t layer8 = weights8 / size_t(std::max(1, p.fp8_layer_count(d.n_layer)));
    r.stored += atty_t * BT * C                           // atty_t
                + (recompute < 3            ? 2 * weights8         // the FP8 weights and their transposes
                   : p.fp8_weights_kept ? weights8 + 4 * C * C  // the weights, one transpose scratch
                                        : layer8 + 4 * C * C);  // one layer's, one transpose scratch
    r.scratch += 3 * BT * 4 * C + f * 4 * C;              // q_in, q_dout_t, q_inp_t, colsum
  }
  if (p.fp8_classifier) {
    r.stored += 2 * Vp * C;                               // wte in FP8 and transposed
    r.scratch += chunk * Vp + C * chunk;                  // dlogits_q, lnf_t
  }
  return r;
}

GPT::GPT(const ModelSpec& spec, const ParamLayout& layout, Backend& be, int B, int T, int recompute,
         Fp8Scaling* fp8, int chunk_rows)
    : d_(spec.dims), layout_(layout), be_(be), B_(B), T_(T),
      chunk_rows_(int(std::min(size_t(B) * T, size_t(std::max(1, chunk_rows))))),
      ctx_{be},
      fp8_(fp8),
      blocks_(make_blocks(layout, spec.precision, fp8)),
      lnf_(layout, -1, "lnfw", "lnfb", spec.dims.n_embd),
      head_(layout, chunk_rows_, LayerPrecision{spec.precision.fp8_classifier ? fp8 : nullptr}),
      a_(std::make_unique<Acts>()) {
  const ModelDims& d = spec.dims;
  const PrecisionPolicy& policy = spec.precision;
  if (policy.any_fp8() && !fp8) throw Error(kExitFailure, "internal error: FP8 layers without their scaling state");
  const size_t BT = size_t(B) * T, C = d.n_embd, L = d.n_layer, NH = d.n_head, Vp = d.padded_vocab;
  ctx_.B = B, ctx_.T = T, ctx_.N = int(BT), ctx_.recompute = recompute, ctx_.act = d_.activation;
  const Bucket& emb = layout.bucket(0);
  wte_ = emb.tensor("wte").offset;
  wpe_ = d.pos_embedding == PosEmbedding::learned ? emb.tensor("wpe").offset : kNoWpe;
  if (fp8) fp8->allocate();  // every scaled tensor registered
  if (fp8 && fp8->size() != fp8_scaled_tensors(spec))  // what the memory prediction counts
    throw Error(kExitFailure, "internal error: the model registered " + std::to_string(fp8->size()) +
                                  " FP8 scaled tensors where fp8_scaled_tensors counts " +
                                  std::to_string(fp8_scaled_tensors(spec)));

  // the block products' inputs: FP8 bytes where the product is FP8; a buffer the layers share holds the widest
  const size_t e = dtype_size(be.act_dtype());
  auto q_shared = [&](Product x) { return policy.all_layers_product_fp8(x) ? size_t(1) : e; };
  const size_t q_lnf = head_.fp8() ? 1 : e;
  Acts& a = *a_;
  auto A = [&](size_t bytes) {
    void* p = be_.alloc(bytes);
    a.owned.push_back(p);
    return p;
  };
  auto F = [&](size_t n) { return static_cast<float*>(A(n * 4)); };
  const size_t before = be.bytes_in_use();
  try {
    a.encoded = A(e * BT * C);
    void* shared_ln1 = recompute == 2 ? A(q_shared(Product::qkv) * BT * C) : nullptr;
    void* shared_ln2 = recompute == 2 ? A(q_shared(Product::fc) * BT * C) : nullptr;
    void* shared_gelu = recompute == 1 || recompute == 2 ? A(q_shared(Product::fcproj) * BT * 4 * C) : nullptr;
    // layer l's (or, at recompute 3, every layer's: l -1)
    auto block_acts = [&](int l) {
      auto q = [&](Product x) { return l < 0 ? q_shared(x) : policy.product_fp8(l, x) ? 1 : e; };
      const bool attproj_fp8 = l < 0 ? policy.product_layer_count(int(L), Product::attproj) > 0
                                     : policy.product_fp8(l, Product::attproj);
      BlockActs b{};
      b.ln1 = shared_ln1 ? shared_ln1 : A(q(Product::qkv) * BT * C);
      b.ln1_mean = F(BT);
      b.ln1_rstd = F(BT);
      b.qkv = A(e * BT * 3 * C);
      b.atty = A(e * BT * C);
      b.lse = F(NH * BT);
      b.res2 = A(e * BT * C);
      b.ln2 = shared_ln2 ? shared_ln2 : A(q(Product::fc) * BT * C);
      b.ln2_mean = F(BT);
      b.ln2_rstd = F(BT);
      b.fch = A(e * BT * 4 * C);
      b.fch_gelu = shared_gelu ? shared_gelu : A(q(Product::fcproj) * BT * 4 * C);
      if (attproj_fp8) b.atty_t = A(BT * C);
      return b;
    };
    const BlockActs shared = recompute >= 3 ? block_acts(-1) : BlockActs{};  // every layer's at recompute 3
    // recompute 3 keeps no FP8 weight transposes either: one scratch, filled by each product's backward
    void* weight_t = recompute >= 3 && policy.fp8_linear ? A(blocks_[0].largest_weight()) : nullptr;
    // and, unless the policy keeps them, one layer's FP8 weight copies for all: each block's forward casts
    // its weights into them, and its backward again (the same bytes)
    const bool one_copy = recompute >= 3 && !policy.fp8_weights_kept;
    void* shared_w8 = nullptr;
    for (size_t l = 0; l < L; ++l) {
      a.block.push_back(recompute >= 3 ? shared : block_acts(int(l)));
      a.res3.push_back(A(e * BT * C));
      if (!policy.layer_fp8(int(l))) continue;
      const size_t bytes = blocks_[l].weight_cache_bytes(!weight_t);
      if (!one_copy) {
        blocks_[l].set_weight_cache(A(bytes), weight_t);
        continue;
      }
      if (!shared_w8) shared_w8 = A(bytes);  // every FP8 layer's products are the same (fp8_products)
      blocks_[l].set_weight_cache(shared_w8, weight_t, w8_owners_.data());
    }
    a.lnf = A(q_lnf * BT * C);
    a.lnf_mean = F(BT);
    a.lnf_rstd = F(BT);
    if (head_.fp8()) head_.set_weight_cache(A(head_.weight_cache_bytes()));
    stored_bytes_ = be.bytes_in_use() - before;
    a.logits = A(e * size_t(chunk_rows_) * Vp);
    a.losses = F(BT);
    a.tokens = static_cast<int*>(A(4 * BT));
    a.targets = static_cast<int*>(A(4 * BT));
    a.scratch_c = A(e * BT * C);
    a.dres = A(e * BT * C);
    a.dlnf = A(e * BT * C);
    a.dtmp = A(e * BT * C);
    a.datty = A(e * BT * C);
    a.dbig = A(e * BT * 4 * C);
    a.dres_colsum = F(C);
    if (policy.fp8_linear) {
      ctx_.q_in = A(BT * 4 * C);
      ctx_.q_dout_t = A(BT * 4 * C);
      ctx_.q_inp_t = A(BT * 4 * C);
      ctx_.colsum = F(4 * C);
    }
    if (head_.fp8()) {
      a.dlogits_q = A(size_t(chunk_rows_) * Vp);
      a.lnf_t = A(C * size_t(chunk_rows_));
    }
    scratch_bytes_ = be.bytes_in_use() - before - stored_bytes_;
  } catch (...) {  // out of memory part-way: give back what was taken
    for (void* p : a.owned) be_.free(p);
    throw;
  }
  losses_host_.resize(BT);
}

GPT::~GPT() {
  for (void* p : a_->owned) be_.free(p);
}

BucketView GPT::params_of(ParamStore& ps, int b) const {
  return {static_cast<char*>(const_cast<void*>(ps.params(b))), dtype_size(be_.act_dtype()), ps.gathers_fp8(b)};
}
BucketView GPT::grads_of(ParamStore& ps, int b) const {
  return {static_cast<char*>(ps.grads(b)), dtype_size(be_.act_dtype())};
}

BlockIo GPT::io(int l) const {
  const Acts& a = *a_;
  return {l == 0 ? a.encoded : a.res3[l - 1], a.scratch_c, a.dbig, a.dres, a.dres_colsum, a.dtmp, a.datty};
}

ClassifierActs GPT::head_acts() const {
  const Acts& a = *a_;
  return {a.lnf, a.targets, a.losses, a.logits, a.dlnf, a.dlogits_q, a.lnf_t};
}

void GPT::trunk(ParamStore& ps, const int* tokens, bool train) {
  const int C = d_.n_embd, L = d_.n_layer;
  Acts& a = *a_;
  be_.copy_h2d(a.tokens, tokens, sizeof(int) * size_t(ctx_.N));
  // A store that gathers FP8 weights as FP8 is asked for them when a layer's copies are out of date (once
  // per change of the parameters or scales), a layer ahead like the parameters
  const uint64_t version = ps.params_version(), scales = fp8_ ? fp8_->scales_version() : 0;
  auto fp8_stale = [&](int l) {
    return ps.gathers_fp8(layout_.layer_bucket(l)) && !blocks_[l].fp8_weights_current(version);
  };
  ps.prefetch(layout_.layer_bucket(0));
  if (fp8_stale(0)) ps.prefetch_fp8(layout_.layer_bucket(0), scales);
  const BucketView we = params_of(ps, 0);
  be_.encoder_fwd(EncoderFwd{a.encoded, a.tokens, we.at(wte_), wpe_ == kNoWpe ? nullptr : we.at(wpe_), B_, T_, C});
  for (int l = 0; l < L; ++l) {
    const int b = layout_.layer_bucket(l);
    ps.prefetch(l + 1 < L ? b + 1 : layout_.final_bucket());
    if (l + 1 < L && fp8_stale(l + 1)) ps.prefetch_fp8(b + 1, scales);
    BucketView w = params_of(ps, b);
    if (fp8_stale(l)) w.fp8 = static_cast<const uint8_t*>(ps.fp8_params(b, scales));
    const BlockActs& x = a.block[l];
    if (l == 0) {
      const Fp8Tensor q = blocks_[0].ln1_fp8() ? blocks_[0].ln1_q(x.ln1, train) : Fp8Tensor{};
      blocks_[0].ln1().forward(ctx_, w, x.ln1, x.ln1_mean, x.ln1_rstd, nullptr, a.encoded, nullptr,
                               blocks_[0].ln1_fp8() ? &q : nullptr);
    }
    blocks_[l].forward(ctx_, w, ps.params_version(), x, io(l), train ? Pass::train : Pass::eval);
    next_layernorm(ps, l, train);
  }
}

// res3 = res2 + mlp; then the next LayerNorm on it: layer l+1's ln1 (FP8 when its products are), or the
// final one (FP8 when the classifier is)
void GPT::next_layernorm(ParamStore& ps, int l, bool train) {
  const int L = d_.n_layer;
  Acts& a = *a_;
  const BlockActs& x = a.block[l];
  if (l + 1 < L) {
    const Block& next = blocks_[l + 1];
    const BlockActs& y = a.block[l + 1];
    const BucketView wn = params_of(ps, layout_.layer_bucket(l + 1));
    const Fp8Tensor q = next.ln1_fp8() ? next.ln1_q(y.ln1, train) : Fp8Tensor{};
    next.ln1().forward(ctx_, wn, y.ln1, y.ln1_mean, y.ln1_rstd, a.res3[l], x.res2, a.scratch_c,
                       next.ln1_fp8() ? &q : nullptr);
  } else {
    const BucketView wn = params_of(ps, layout_.final_bucket());
    const Fp8Tensor q = head_.fp8() ? head_.input_q(a.lnf, train) : Fp8Tensor{};
    lnf_.forward(ctx_, wn, a.lnf, a.lnf_mean, a.lnf_rstd, a.res3[l], x.res2, a.scratch_c, head_.fp8() ? &q : nullptr);
  }
}

void GPT::logits_row(ParamStore& ps, const int* tokens, int row, float* out) {
  trunk(ps, tokens, false);
  head_.logits_row(ctx_, params_of(ps, 0), ps.params_version(), head_acts(), row, out);
}

float GPT::forward(ParamStore& ps, const int* tokens, const int* targets, bool train, float dloss) {
  const int N = ctx_.N;
  Acts& a = *a_;
  trunk(ps, tokens, train);
  be_.copy_h2d(a.targets, targets, sizeof(int) * N);
  // lm head (tied to wte): losses, and in training dlnf and dwte (the store is asked for the embedding's
  // parameters, then its gradients)
  const BucketView we = params_of(ps, 0);
  const BucketView ge = train ? grads_of(ps, 0) : BucketView{};
  head_.forward(ctx_, we, train ? &ge : nullptr, ps.params_version(), head_acts(), dloss);
  be_.copy_d2h(losses_host_.data(), a.losses, sizeof(float) * N);
  double s = 0;
  for (int i = 0; i < N; ++i) s += losses_host_[i];
  return float(s / N);
}

void GPT::backward(ParamStore& ps) {
  const int C = d_.n_embd, L = d_.n_layer, N = ctx_.N;
  Acts& a = *a_;
  const size_t e = dtype_size(be_.act_dtype());
  const int fb = layout_.final_bucket();

  be_.zero(a.dres, e * size_t(N) * C);
  ps.prefetch(layout_.layer_bucket(L - 1));
  // Each LayerNorm backward adds its branch into dres and sums dres's columns: the bias gradient of the
  // projection whose output was the residual stream there (layer l's fcproj, then its attproj).
  // the store is asked for gradients, then parameters (at ZeRO-2/3 each call may queue work)
  const BucketView gf = grads_of(ps, fb);
  const BucketView wf = params_of(ps, fb);
  lnf_.backward(ctx_, wf, gf, a.dres, a.dlnf, a.res3[L - 1], a.lnf_mean, a.lnf_rstd, a.dres_colsum);
  ps.grads_done(fb);
  for (int l = L - 1; l >= 0; --l) {
    const int b = layout_.layer_bucket(l);
    ps.prefetch(l > 0 ? b - 1 : 0);
    const BucketView w = params_of(ps, b);
    const BucketView g = grads_of(ps, b);
    blocks_[l].backward(ctx_, w, g, ps.params_version(), a.block[l], io(l));
    ps.grads_done(b);
  }
  const BucketView ge = grads_of(ps, 0);
  be_.encoder_bwd(EncoderBwd{ge.at(wte_), wpe_ == kNoWpe ? nullptr : ge.at(wpe_), a.dres, a.tokens, B_, T_, C});
  ps.grads_done(0);
}

}  // namespace gpt
