#include "model/block.hpp"

#include <algorithm>

namespace gpt {

namespace {
// product p's precision: the layer's where p is among fp8_products, else on values
LayerPrecision product_precision(LayerPrecision linear, unsigned fp8_products, int p) {
  if (!(fp8_products >> p & 1u)) linear.fp8 = nullptr;
  return linear;
}
}  // namespace

Block::Block(const ParamLayout& L, int layer, LayerPrecision linear, unsigned fp8_products)
    : layer_(layer),
      C_(L.dims().n_embd),
      gelu_epilogue_(linear.gelu_epilogue),
      ln1_(L, layer, "ln1w", "ln1b", L.dims().n_embd),
      ln2_(L, layer, "ln2w", "ln2b", L.dims().n_embd),
      qkv_(L, layer, "qkvw", "qkvb", L.dims().n_embd, 3 * L.dims().n_embd, product_precision(linear, fp8_products, 0)),
      attproj_(L, layer, "attprojw", "attprojb", L.dims().n_embd, L.dims().n_embd,
               product_precision(linear, fp8_products, 1)),
      fc_(L, layer, "fcw", "fcb", L.dims().n_embd, 4 * L.dims().n_embd, product_precision(linear, fp8_products, 2)),
      fcproj_(L, layer, "fcprojw", "fcprojb", 4 * L.dims().n_embd, L.dims().n_embd,
              product_precision(linear, fp8_products, 3)),
      attn_(L.dims().n_head, L.dims().head_dim(), L.dims().pos_embedding == PosEmbedding::rope) {}

size_t Block::weight_cache_bytes(bool transposed_too) const {
  return qkv_.weight_cache_bytes(transposed_too) + attproj_.weight_cache_bytes(transposed_too) +
         fc_.weight_cache_bytes(transposed_too) + fcproj_.weight_cache_bytes(transposed_too);
}

size_t Block::largest_weight() const {
  return std::max({qkv_.weight_elems(), attproj_.weight_elems(), fc_.weight_elems(), fcproj_.weight_elems()});
}

void Block::set_weight_cache(void* p, void* transposed, const void** owners) {
  char* at = static_cast<char*>(p);
  int i = 0;
  for (Linear* x : {&qkv_, &attproj_, &fc_, &fcproj_}) {
    x->set_weight_cache(at, transposed, owners ? owners + i : nullptr);
    at += x->weight_cache_bytes(transposed == nullptr);
    ++i;
  }
}

bool Block::fp8_weights_current(uint64_t params_version) const {
  for (const Linear* x : {&qkv_, &attproj_, &fc_, &fcproj_})
    if (!x->weight_current(params_version)) return false;
  return true;
}

std::vector<Fp8WeightRange> Block::fp8_weights() const {
  std::vector<Fp8WeightRange> r;
  for (const Linear* x : {&qkv_, &attproj_, &fc_, &fcproj_})
    if (x->fp8()) r.push_back(x->fp8_weight());
  return r;
}

void Block::forward(const LayerCtx& c, const BucketView& w, uint64_t version, const BlockActs& a,
                    const BlockIo& io, Pass pass) const {
  // record: the FP8 amaxes; keep: what only the backward reads (at recompute 3 its recomputation makes it)
  const bool record = pass == Pass::train;
  const bool keep = pass == Pass::recompute || (record && c.recompute < 3);
  qkv_.forward(c, w, version, a.qkv, {a.ln1, qkv_.fp8()}, nullptr, record, nullptr);
  attn_.forward(c, a.atty, a.lse, a.qkv);
  attproj_.forward(c, w, version, io.scratch_c, {a.atty, false}, nullptr, record, keep ? a.atty_t : nullptr);
  const Fp8Tensor ln2_q = fc_.fp8() ? fc_.input_q(a.ln2, record) : Fp8Tensor{};
  ln2_.forward(c, w, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, io.res_in, io.scratch_c, fc_.fp8() ? &ln2_q : nullptr);
  // fc, GELU, fcproj. fc's output before GELU is kept (fch) for GELU's derivative; what fcproj's weight
  // gradient needs is GELU's output: kept as it is in bf16. FP8 keeps it as FP8 bytes, made in one of two
  // ways: by fc's epilogue (the policy's choice, nothing recomputed), or by fcproj's input cast, which
  // applies GELU to fch on the way and keeps the bytes transposed (recomputation casts fch the same way
  // again: the same bytes).
  if (gelu_in_fp8(c)) {
    fc_.forward_gelu_q(c, w, version, fcproj_.input_q(a.fch_gelu, record), {a.ln2, true}, a.fch, record, io.dbig);
    fcproj_.forward(c, w, version, io.scratch_c, {a.fch_gelu, true}, nullptr, record, nullptr);
    return;
  }
  const bool recomputing = pass == Pass::recompute;  // fcproj's output is in the residual stream already
  if (fcproj_.fp8()) {
    fc_.forward(c, w, version, a.fch, {a.ln2, fc_.fp8()}, nullptr, record, nullptr);
    if (!recomputing)
      fcproj_.forward(c, w, version, io.scratch_c, {a.fch, false, true}, nullptr, record,
                      keep && c.recompute < 1 ? a.fch_gelu : nullptr);
    return;
  }
  fc_.forward(c, w, version, a.fch_gelu, {a.ln2, fc_.fp8()}, a.fch, record, nullptr);
  if (!recomputing) fcproj_.forward(c, w, version, io.scratch_c, {a.fch_gelu, false}, nullptr, record, nullptr);
}

void Block::backward(const LayerCtx& c, const BucketView& w, const BucketView& g, uint64_t params_version,
                     const BlockActs& a, const BlockIo& io) const {
  if (c.recompute >= 3) {
    // The whole block again from its input, the residual stream kept by the model: ln1 (the forward's
    // LayerNorm fused with the residual add before it normalised the stored sum: the same bits), then
    // the forward up to fc, with the forward's FP8 scales and weight copies and no amax recorded
    const Fp8Tensor q = qkv_.fp8() ? qkv_.input_q(a.ln1, false) : Fp8Tensor{};
    ln1_.forward(c, w, a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, io.res_in, nullptr, qkv_.fp8() ? &q : nullptr);
    forward(c, w, params_version, a, io, Pass::recompute);
    fcproj_.cast_weight(c, w, params_version);  // left out of the recomputation; a shared copy holds another layer's
  }
  // MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
  // GELU's output again (FP8: cast from fch with the forward's scale, the same bytes), unless the
  // recomputation's fc epilogue wrote it (bf16 at recompute 3)
  if (c.recompute >= 1 && (c.recompute < 3 || fcproj_.fp8())) {
    if (fcproj_.fp8())
      fcproj_.recompute_saved(c, a.fch_gelu, {a.fch, false, true});
    else
      c.be.activation_fwd(ActivationFwd{a.fch_gelu, a.fch, size_t(c.N) * 4 * C_, c.act});
  }
  // GELU's derivative: in fcproj's input-gradient epilogue where it has one (bf16), else in the cast of
  // fc's output gradient (FP8: cuBLASLt's DGELU epilogue on FP8 operands measured 5x slower than the plain
  // product on an H200, 19.1 against 3.7 ms a step for GPT-2 124M's fc projections at B=64)
  const bool fused = fcproj_.fuses_dinp_gelu();
  fcproj_.backward(c, w, g, io.dbig, io.dres, {a.fch_gelu, fcproj_.fp8() && !gelu_in_fp8(c)}, io.dres_colsum,
                   fused ? a.fch : nullptr, nullptr);
  if (c.recompute == 2) {
    const Fp8Tensor q = fc_.fp8() ? fc_.input_q(a.ln2, false) : Fp8Tensor{};
    ln2_.forward(c, w, a.ln2, a.ln2_mean, a.ln2_rstd, nullptr, a.res2, nullptr, fc_.fp8() ? &q : nullptr);
  }
  fc_.backward(c, w, g, io.dtmp, io.dbig, {a.ln2, false}, nullptr, nullptr, fused ? nullptr : a.fch);
  ln2_.backward(c, w, g, io.dres, io.dtmp, a.res2, a.ln2_mean, a.ln2_rstd, io.dres_colsum);
  // dres holds d/d(res2). Attention: res2 = res_in + attproj(attention(qkv(ln1(res_in))))
  attproj_.backward(c, w, g, io.datty, io.dres, {attproj_.fp8() ? a.atty_t : a.atty, attproj_.fp8()}, io.dres_colsum,
                    nullptr, nullptr);
  attn_.backward(c, io.dbig, io.datty, a.qkv, a.atty, a.lse);
  if (c.recompute == 2) {
    const Fp8Tensor q = qkv_.fp8() ? qkv_.input_q(a.ln1, false) : Fp8Tensor{};
    ln1_.forward(c, w, a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, io.res_in, nullptr, qkv_.fp8() ? &q : nullptr);
  }
  qkv_.backward(c, w, g, io.dtmp, io.dbig, {a.ln1, false}, nullptr, nullptr, nullptr);
  ln1_.backward(c, w, g, io.dres, io.dtmp, io.res_in, a.ln1_mean, a.ln1_rstd, layer_ > 0 ? io.dres_colsum : nullptr);
}

}  // namespace gpt
