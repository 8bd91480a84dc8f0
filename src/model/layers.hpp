// The layers GPT-2 is built from. Each owns the names of its parameters (resolved once against the
// parameter table's layout), its precision (a bf16/fp32 product, or FP8 with the scaled tensors it
// registered) and the ops it calls; none holds global state or activation memory (the model hands each
// call the buffers: model/gpt.cpp). A layer's forward and backward are the same calls for every
// precision: where FP8 changes what is computed (a cast, a transposed copy kept for the weight gradient,
// GELU's derivative applied in a cast instead of an epilogue), the layer decides it, so the block
// (model/block.cpp) is written once.
//
// Shapes: N = B*T rows; activations (N, features) row-major in the backend's activation dtype; FP8
// tensors are bytes; "_t" a transposed copy (features, N).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "backend/backend.hpp"
#include "model/fp8_scaling.hpp"
#include "model/param_store.hpp"
#include "model/params.hpp"

namespace gpt {

// What every layer call runs with: the backend, the step's shape and the scratch FP8 layers share.
struct LayerCtx {
  Backend& be;
  int B = 0, T = 0, N = 0;  // N = B*T
  int recompute = 0;        // training.recompute
  Activation act = Activation::gelu;  // model.activation: what "GELU" below stands for
  // FP8 scratch (one stream: no two ops use them at once), null without FP8 layers
  void* q_in = nullptr;       // (N, 4C) bytes: a product's row-major FP8 operand
  void* q_dout_t = nullptr;   // (4C, N) bytes: a product's output gradient, transposed
  void* q_inp_t = nullptr;    // (4C, N) bytes: a product's input, transposed
  float* colsum = nullptr;    // (4C): bias gradient of a product whose output gradient had no column sums
};

// One bucket's parameters or gradients as the store handed them out, addressed by tensor offset.
struct BucketView {
  char* base = nullptr;
  size_t esz = 0;  // element size (the activation dtype's)
  // Parameters only: the store gathers this bucket's FP8 weights as FP8 (ParamStore::fp8_params), so
  // their act-dtype values are not there; fp8: the gathered bytes (one an element, at each weight's
  // offset), when the model asked for them because its FP8 copies were out of date
  bool fp8_only = false;
  const uint8_t* fp8 = nullptr;
  void* at(size_t offset) const { return base + offset * esz; }
};

// The precision a layer computes in: its products on FP8 operands (with its own scaled tensors), or
// in the activation dtype.
struct LayerPrecision {
  Fp8Scaling* fp8 = nullptr;  // null: bf16/fp32
  bool gelu_epilogue = true;  // FP8 with GELU: its output in FP8 from the product's epilogue, not a cast
};

// A product's FP8 state, for every layer whose product runs on FP8 operands (Linear, Classifier): its
// three scaled tensors (named name("input"), name("weight"), name("grad")) and the FP8 copies of its
// weight (rows, cols) and of the weight's transpose, cast once per change of the parameters or the scales
// (the weight's amax is recorded every time: the same values however often they are cast). Default: no FP8.
class Fp8Product {
 public:
  Fp8Product() = default;
  template <class Name>
  Fp8Product(Fp8Scaling* fp8, Name&& name, int rows, int cols) : fp8_(fp8), rows_(rows), cols_(cols) {
    if (!fp8_) return;
    q_input_ = fp8_->add(name("input"), Fp8Format::E4M3);
    q_weight_ = fp8_->add(name("weight"), Fp8Format::E4M3);
    q_grad_ = fp8_->add(name("grad"), fp8_->recipe().grad);
  }
  bool on() const { return fp8_ != nullptr; }
  // The input's FP8 form (its scale) with bytes at data; record false: its amax is not recorded.
  Fp8Tensor input(void* data, bool record) const { return fp8_->tensor(q_input_, data, record); }
  // The output gradient's FP8 form with bytes at data.
  Fp8Tensor grad(void* data) const { return fp8_->tensor(q_grad_, data); }
  // The weight's FP8 copy (rows, cols), or its transpose (cols, rows).
  Fp8Tensor weight(bool transposed) const {
    return fp8_->tensor(q_weight_, static_cast<char*>(w8_) + (transposed ? size_t(rows_) * cols_ : 0));
  }
  // Bytes of the weight copies: 2 * rows * cols (the weight and its transpose), rows * cols when the
  // transpose is not kept (transposed_too false); 0 without FP8.
  size_t weight_cache_bytes(bool transposed_too = true) const {
    return fp8_ ? (transposed_too ? 2 : 1) * size_t(rows_) * cols_ : 0;
  }
  // p: the copies' bytes (weight_cache_bytes(transposed == nullptr)). transposed: a scratch shared with
  // other products, which weight_t fills from the weight's copy each time the backward needs the
  // transpose (the same bytes a kept transpose holds), so that it is not kept between uses. owner: p is
  // shared with the same product of other layers (one layer's copies for all, recompute 3), *owner the
  // product whose weight it holds: a copy another product overwrote is cast again (the same bytes).
  void set_weight_cache(void* p, void* transposed = nullptr, const void** owner = nullptr) {
    w8_ = p, wt_ = transposed, owner_ = owner;
  }
  // The transposed FP8 weight for the input gradient: the kept copy, or transposed into the scratch now.
  Fp8Tensor weight_t(const LayerCtx& c) const;
  // Whether both copies hold the parameters of this version cast with the current scales.
  bool current(uint64_t params_version) const {
    return key_ == key(params_version) && (!owner_ || *owner_ == this);
  }
  // The weight at `offset` of bucket w -> both copies, unless they are current: cast from the activation
  // dtype, or (w.fp8) copied from the bytes the store gathered, then transposed.
  void cast_weight(const LayerCtx& c, const BucketView& w, size_t offset, uint64_t params_version) const;
  // The weight's FP8 form as a store casts pieces of it (amax recorded, as cast_weight does), no bytes.
  Fp8Tensor weight_scaling() const { return fp8_->tensor(q_weight_, nullptr); }

 private:
  Fp8Scaling* fp8_ = nullptr;
  int rows_ = 0, cols_ = 0;
  int q_input_ = -1, q_weight_ = -1, q_grad_ = -1;  // FP8 slots
  std::pair<uint64_t, uint64_t> key(uint64_t params_version) const { return {params_version, fp8_->scales_version()}; }
  void* w8_ = nullptr;                              // FP8 weight (rows, cols) then its transpose (cols, rows)
  void* wt_ = nullptr;                              // or: the transpose's shared scratch (not kept)
  const void** owner_ = nullptr;                    // w8_ shared between layers: whose weight it holds
  mutable std::pair<uint64_t, uint64_t> key_{0, ~uint64_t(0)};  // what w8_ was cast from: parameters, scales versions
};

// y (N, out) = x (N, in) @ W^T + b, W (out, in) and b (out) from the parameter table (`weight`, `bias`
// names; product name from the table's row for W).
class Linear {
 public:
  Linear(const ParamLayout& L, int layer, const char* weight, const char* bias, int in, int out,
         LayerPrecision p);
  bool fp8() const { return q_.on(); }
  // The FP8 form of this product's input (its scale), bytes at data: what a producer that writes the
  // input directly in FP8 (LayerNorm) quantizes with. record false: its amax is not recorded.
  Fp8Tensor input_q(void* data, bool record) const { return q_.input(data, record); }
  // Bytes of this product's FP8 weight copies (the weight and its transpose): 2 * in * out; 0 in bf16.
  size_t weight_cache_bytes(bool transposed_too = true) const { return q_.weight_cache_bytes(transposed_too); }
  void set_weight_cache(void* p, void* transposed = nullptr, const void** owner = nullptr) {
    q_.set_weight_cache(p, transposed, owner);
  }
  // FP8: the weight copy made current (cast again where a shared copy holds another layer's)
  void cast_weight(const LayerCtx& c, const BucketView& w, uint64_t params_version) const {
    if (q_.on()) q_.cast_weight(c, w, w_, params_version);
  }
  size_t weight_elems() const { return size_t(in_) * out_; }
  // FP8: whether the weight copies hold this version of the parameters with the current scales (true
  // in bf16), and where the weight is in its bucket with its scaling (a store that casts it)
  bool weight_current(uint64_t params_version) const { return !q_.on() || q_.current(params_version); }
  Fp8WeightRange fp8_weight() const { return {w_, size_t(in_) * out_, q_.weight_scaling()}; }

  // The input as the forward got it: x in the activation dtype, or already FP8 (written with input_q).
  // gelu (FP8 only): x is the previous product's output before GELU (the model's activation, c.act),
  // applied in this product's cast.
  struct Input {
    const void* x;
    bool quantized;
    bool gelu = false;
  };
  // out = x W^T + b; with pre_gelu: pre_gelu = that, out = gelu_tanh(pre_gelu). FP8 with an input in
  // the activation dtype: it is cast first, and its transposed bytes go to keep_t when given (what the
  // weight gradient needs later). params_version: the parameters' version (the FP8 weight copies are
  // cast again when it or the scales changed).
  void forward(const LayerCtx& c, const BucketView& w, uint64_t params_version, void* out, Input in,
               void* pre_gelu, bool train, void* keep_t) const;
  // FP8, with GELU, for a next product on FP8 operands: out_q.data (N, out) = GELU's output in FP8 with
  // out_q's scale (the next product's input_q), straight from the product's epilogue; pre_gelu as above.
  // scratch (N, out), activation dtype: where the output goes first when the backend has no such
  // epilogue (then cast).
  void forward_gelu_q(const LayerCtx& c, const BucketView& w, uint64_t params_version, const Fp8Tensor& out_q,
                      Input in, void* pre_gelu, bool train, void* scratch) const;
  // What the forward left for the weight gradient: the input x (activation dtype, or FP8 row-major), or
  // FP8 bytes already transposed.
  struct Saved {
    const void* x;
    bool transposed;
  };
  // Whether GELU's derivative of the input can be applied to dinp in this product's epilogue (bf16);
  // an FP8 product leaves it to the next product's cast (backward's gelu_dout).
  bool fuses_dinp_gelu() const { return !q_.on(); }
  // dinp = dout @ W (times gelu'(gelu_dinp) when given); dW += dout^T x, db += column sums of dout,
  // taken from dout_colsum when the op that wrote dout summed them. FP8 only: dout is first multiplied
  // by gelu'(gelu_dout) (the previous product's GELU).
  void backward(const LayerCtx& c, const BucketView& w, const BucketView& g, void* dinp, const void* dout,
                Saved in, const float* dout_colsum, const void* gelu_dinp, const void* gelu_dout) const;
  // FP8: the forward's input cast again with the forward's scale (recomputation): transposed bytes to
  // keep_t, from in.x in the activation dtype (through GELU with in.gelu). No-op in bf16.
  void recompute_saved(const LayerCtx& c, void* keep_t, Input in) const;

 private:
  size_t w_, b_;  // offsets in the bucket (b_: none without a bias, model.bias false)
  int in_, out_;
  Fp8Tensor input_fp8(const LayerCtx& c, const BucketView& w, uint64_t params_version, Input in, bool train,
                      void* keep_t) const;
  // in.x cast into x.data (row-major) and/or keep_t (transposed)
  void cast_input(const LayerCtx& c, const Fp8Tensor& x, void* keep_t, Input in) const;

  Fp8Product q_;  // W (out, in)
};

// The model's normalisation (model.norm) over C features: out = LayerNorm(x) * w + b, or RMSNorm(x) * w
// (the bias tensor is not in the table then, nor with model.bias false); mean (layernorm), rstd (N) fp32.
class Norm {
 public:
  Norm(const ParamLayout& L, int layer, const char* weight, const char* bias, int C);
  // x = a, or with b non-null residual = a + b (written) and x = residual. With q non-null, out is
  // written in FP8 with q's scale (q.data = out) for the product that reads it.
  void forward(const LayerCtx& c, const BucketView& w, void* out, float* mean, float* rstd, void* residual,
               const void* a, const void* b, const Fp8Tensor* q) const;
  // accumulates dinp, dw, db (layernorm); dinp_colsum (nullable): overwritten with dinp's column sums (the bias
  // gradient of the product that wrote the residual stream here)
  void backward(const LayerCtx& c, const BucketView& w, const BucketView& g, void* dinp, const void* dout,
                const void* inp, const float* mean, const float* rstd, float* dinp_colsum) const;

 private:
  NormKind kind_;
  size_t w_, b_;  // b_: none without a bias (rmsnorm; model.bias false)
  int C_;
  bool sums_;     // the input gradient's column sums wanted: the products have biases (model.bias)
};

// Causal self-attention over qkv (B, T, 3, NH, HS) -> out (B, T, NH, HS); lse (B, NH, T) fp32 kept.
// With rotary position embedding (model.pos_embedding: rope) the forward rotates q and k in place first
// (qkv then holds what attention saw, for its backward), and the backward rotates dq and dk back.
class Attention {
 public:
  Attention(int n_head, int head_dim, bool rope) : NH_(n_head), HS_(head_dim), rope_(rope) {}
  void forward(const LayerCtx& c, void* out, float* lse, void* qkv) const;
  void backward(const LayerCtx& c, void* dqkv, const void* dout, const void* qkv, const void* out,
                const float* lse) const;

 private:
  int NH_, HS_;
  bool rope_;
};

}  // namespace gpt
