#include "model/layers.hpp"

namespace gpt {

namespace {
const TensorInfo& layer_tensor(const ParamLayout& L, int layer, const char* name) {
  return L.bucket(layer >= 0 ? L.layer_bucket(layer) : L.final_bucket()).tensor(name);
}
// A bias's offset, or kNoBias where the table says this model has none (model.bias false; a norm's under
// rmsnorm); a name the table lacks is an internal error, never a silently missing bias
constexpr size_t kNoBias = ~size_t(0);
size_t bias_offset(const ParamLayout& L, int layer, const char* name) {
  for (const ParamSpec& s : param_table())
    if (name == std::string(s.name) && !s.in(L.dims())) return kNoBias;
  return layer_tensor(L, layer, name).offset;
}
void* bias_at(const BucketView& v, size_t offset) { return offset == kNoBias ? nullptr : v.at(offset); }
}  // namespace

// ---- Fp8Product

void Fp8Product::cast_weight(const LayerCtx& c, const BucketView& w, size_t offset, uint64_t params_version) const {
  if (current(params_version)) return;
  const Fp8Tensor q = weight(false);
  void* keep_t = wt_ ? nullptr : weight(true).data;  // the transpose, when it is kept
  if (w.fp8) {
    c.be.copy_d2d(q.data, w.fp8 + offset, size_t(rows_) * cols_);
    if (keep_t) c.be.fp8_transpose({keep_t, q.data, rows_, cols_});
  } else if (w.fp8_only) {
    throw Error(kExitFailure, "internal error: an FP8 weight copy out of date without the store's FP8 bytes");
  } else {
    Fp8Cast cast;
    cast.q = q, cast.q_t = keep_t, cast.x = w.at(offset), cast.N = rows_, cast.C = cols_;
    c.be.fp8_cast(cast);
  }
  key_ = key(params_version);
  if (owner_) *owner_ = this;
}

Fp8Tensor Fp8Product::weight_t(const LayerCtx& c) const {
  if (!wt_) return weight(true);
  c.be.fp8_transpose({wt_, weight(false).data, rows_, cols_});
  return fp8_->tensor(q_weight_, wt_);
}

// ---- Linear

Linear::Linear(const ParamLayout& L, int layer, const char* weight, const char* bias, int in, int out,
               LayerPrecision p)
    : in_(in), out_(out) {
  const TensorInfo& wt = layer_tensor(L, layer, weight);
  w_ = wt.offset;
  b_ = bias_offset(L, layer, bias);
  const char* product = wt.spec->product;
  q_ = Fp8Product(p.fp8, [&](const char* role) { return fp8_tensor_name(layer, product, role); }, out, in);
}

// The FP8 weight copies made current and the input's FP8 form: as the producer wrote it, or cast here
// (row-major for this product, transposed for its weight gradient into keep_t when given).
Fp8Tensor Linear::input_fp8(const LayerCtx& c, const BucketView& w, uint64_t params_version, Input in, bool train,
                            void* keep_t) const {
  q_.cast_weight(c, w, w_, params_version);
  if (in.quantized) return input_q(const_cast<void*>(in.x), train);
  Fp8Tensor x = input_q(c.q_in, train);
  cast_input(c, x, keep_t, in);
  return x;
}

void Linear::cast_input(const LayerCtx& c, const Fp8Tensor& x, void* keep_t, Input in) const {
  Fp8Cast cast;
  cast.q = x, cast.q_t = keep_t, cast.x = in.x, cast.apply = in.gelu ? Fp8Cast::Apply::act : Fp8Cast::Apply::none;
  cast.act = c.act, cast.N = c.N, cast.C = in_;
  c.be.fp8_cast(cast);
}

void Linear::forward(const LayerCtx& c, const BucketView& w, uint64_t params_version, void* out, Input in,
                     void* pre_gelu, bool train, void* keep_t) const {
  MatmulFwd op;
  op.out = out, op.bias = bias_at(w, b_), op.pre_gelu = pre_gelu, op.act = c.act, op.N = c.N, op.IC = in_, op.OC = out_;
  if (!q_.on()) {
    if (in.gelu) throw Error(kExitFailure, "internal error: only an FP8 product applies GELU to its input");
    op.inp = values(in.x), op.w = values(w.at(w_));
  } else {
    op.inp = fp8_bytes(input_fp8(c, w, params_version, in, train, keep_t)), op.w = fp8_bytes(q_.weight(false));
  }
  c.be.matmul_fwd(op);
}

void Linear::forward_gelu_q(const LayerCtx& c, const BucketView& w, uint64_t params_version, const Fp8Tensor& out_q,
                            Input in, void* pre_gelu, bool train, void* scratch) const {
  if (!q_.on() || !pre_gelu || c.act != Activation::gelu)
    throw Error(kExitFailure, "internal error: an FP8 GELU output needs an FP8 product with GELU");
  MatmulFwd op;
  op.out = scratch, op.out_q = out_q, op.bias = bias_at(w, b_), op.pre_gelu = pre_gelu, op.N = c.N, op.IC = in_, op.OC = out_;
  op.inp = fp8_bytes(input_fp8(c, w, params_version, in, train, nullptr)), op.w = fp8_bytes(q_.weight(false));
  c.be.matmul_fwd(op);
}

void Linear::recompute_saved(const LayerCtx& c, void* keep_t, Input in) const {
  if (q_.on()) cast_input(c, input_q(nullptr, false), keep_t, in);
}

// FP8: the output gradient cast once (row-major for the input gradient, transposed for the weight
// gradient, its column sums taken on the way when nobody summed them), then the two products and the
// bias gradient. The weight gradient takes its input transposed: the forward kept it so, or it is
// transposed here.
void Linear::backward(const LayerCtx& c, const BucketView& w, const BucketView& g, void* dinp, const void* dout,
                      Saved in, const float* dout_colsum, const void* gelu_dinp, const void* gelu_dout) const {
  MatmulBwd op;
  op.dinp = dinp, op.dw = g.at(w_), op.dbias = bias_at(g, b_), op.N = c.N, op.IC = in_, op.OC = out_;
  if (!q_.on()) {
    if (gelu_dout) throw Error(kExitFailure, "internal error: a bf16 product cannot apply GELU's derivative to dout");
    op.dout = values(dout), op.inp = values(in.x), op.w = values(w.at(w_));
    op.pre_gelu = gelu_dinp, op.act = c.act, op.dout_colsum = dout_colsum;
    c.be.matmul_bwd(op);
    return;
  }
  if (gelu_dinp) throw Error(kExitFailure, "internal error: an FP8 product leaves GELU's derivative to the cast");
  const void* x_t = in.x;
  if (!in.transposed) {
    c.be.fp8_transpose({c.q_inp_t, in.x, c.N, in_});
    x_t = c.q_inp_t;
  }
  const Fp8Tensor d = q_.grad(c.q_in);
  Fp8Cast cast;
  cast.q = d, cast.q_t = c.q_dout_t, cast.x = dout;
  if (gelu_dout) cast.apply = Fp8Cast::Apply::act_grad, cast.act_in = gelu_dout, cast.act = c.act;
  cast.colsum = dout_colsum || !op.dbias ? nullptr : c.colsum, cast.N = c.N, cast.C = out_;
  c.be.fp8_cast(cast);
  op.dout = fp8_bytes(d), op.w = fp8_bytes(q_.weight_t(c));
  op.dout_t = d, op.dout_t.data = c.q_dout_t;
  op.inp = fp8_bytes(input_q(const_cast<void*>(x_t), true));
  op.dout_colsum = dout_colsum ? dout_colsum : c.colsum;
  c.be.matmul_bwd(op);
}

// ---- Norm

Norm::Norm(const ParamLayout& L, int layer, const char* weight, const char* bias, int C)
    : kind_(L.dims().norm),
      w_(layer_tensor(L, layer, weight).offset),
      b_(bias_offset(L, layer, bias)),
      C_(C),
      sums_(L.dims().bias) {}

void Norm::forward(const LayerCtx& c, const BucketView& w, void* out, float* mean, float* rstd, void* residual,
                   const void* a, const void* b, const Fp8Tensor* q) const {
  NormFwd op;
  op.kind = kind_;
  if (q) {
    op.q = *q;
    op.q.data = out;
  } else {
    op.out = out;
  }
  op.mean = kind_ == NormKind::layernorm ? mean : nullptr, op.rstd = rstd;
  op.residual = b ? residual : nullptr, op.a = a, op.b = b;
  op.w = w.at(w_), op.bias = bias_at(w, b_), op.N = c.N, op.C = C_;
  c.be.norm_fwd(op);
}

void Norm::backward(const LayerCtx& c, const BucketView& w, const BucketView& g, void* dinp, const void* dout,
                    const void* inp, const float* mean, const float* rstd, float* dinp_colsum) const {
  NormBwd op;
  op.kind = kind_;
  op.dinp = dinp, op.dw = g.at(w_), op.db = bias_at(g, b_);
  op.dout = dout, op.inp = inp, op.w = w.at(w_);
  op.mean = kind_ == NormKind::layernorm ? mean : nullptr, op.rstd = rstd;
  op.N = c.N, op.C = C_, op.dinp_colsum = sums_ ? dinp_colsum : nullptr;  // no product has a bias to sum for
  c.be.norm_bwd(op);
}

// ---- Attention

void Attention::forward(const LayerCtx& c, void* out, float* lse, void* qkv) const {
  if (rope_) c.be.rope(Rope{qkv, c.B, c.T, NH_, HS_, false});
  c.be.attention_fwd(AttentionFwd{out, lse, qkv, c.B, c.T, NH_, HS_});
}

void Attention::backward(const LayerCtx& c, void* dqkv, const void* dout, const void* qkv, const void* out,
                         const float* lse) const {
  c.be.attention_bwd(AttentionBwd{dqkv, dout, qkv, out, lse, c.B, c.T, NH_, HS_});
  if (rope_) c.be.rope(Rope{dqkv, c.B, c.T, NH_, HS_, true});
}

}  // namespace gpt
