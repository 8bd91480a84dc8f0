// One transformer block, written once for every precision:
//   res2 = res_in + attproj(attention(qkv(ln1(res_in))))
//   res3 = res2 + fcproj(gelu(fc(ln2(res2))))   (gelu: the model's activation, model.activation)
// The residual add after the MLP and the next LayerNorm are the model's (model/gpt.cpp), so that each
// LayerNorm is fused with the residual add before it.
#pragma once
#include <vector>

#include "model/layers.hpp"

namespace gpt {

// The block's activations, allocated by the model (shared between layers where recomputation allows:
// at recompute 3 one set serves every layer, refilled by the block's recomputation in its backward).
struct BlockActs {
  void* ln1;                  // (N, C): FP8 bytes when qkv is FP8
  float *ln1_mean, *ln1_rstd; // (N)
  void* qkv;                  // (N, 3C)
  void* atty;                 // (N, C)
  void* atty_t;               // (C, N) FP8 bytes when attproj is FP8: its input, transposed
  float* lse;                 // (B, NH, T)
  void* res2;                 // (N, C) the residual after attention
  void* ln2;                  // (N, C): FP8 bytes when fc is FP8
  float *ln2_mean, *ln2_rstd; // (N)
  void* fch;                  // (N, 4C) before GELU
  void* fch_gelu;             // (N, 4C) GELU's output; FP8 bytes when fcproj is FP8: transposed (4C, N), or (N, 4C) from fc's epilogue
};

// What a forward pass is for: evaluation (nothing kept), training (the FP8 amaxes recorded, and what only
// the backward reads kept, unless recompute 3 makes it there), or the backward's recomputation of the block
// (recompute 3: training's activations again, quantized with the forward's scales, the same bytes, nothing
// recorded; fcproj is left out, its output being in the residual stream already).
enum class Pass { eval, train, recompute };

// What a block pass borrows from the model besides its activations.
struct BlockIo {
  const void* res_in;  // (N, C) the residual stream into the block (the embeddings for layer 0)
  void* scratch_c;     // (N, C) forward and recomputation: each projection's output before its residual add
  void* dbig;          // (N, 4C) forward: fc's GELU output when its epilogue cannot write FP8; backward: dfch, dqkv
  void* dres;          // (N, C) backward: d(loss)/d(residual stream), in and out
  float* dres_colsum;  // (C) its column sums: the next projection's bias gradient
  void* dtmp;          // (N, C) backward: a LayerNorm's output gradient
  void* datty;         // (N, C) backward: attention's output gradient
};

class Block {
 public:
  // linear: the precision of the products whose bit is set in fp8_products (kBlockProducts' order); the
  // others run on values
  Block(const ParamLayout& L, int layer, LayerPrecision linear, unsigned fp8_products = kAllBlockProducts);
  // The FP8 weight copies of the block's products, bytes (the model allocates them): each weight and its
  // transpose, or (transposed_too false) the weights alone, their transposes made in `transposed`, a
  // scratch of largest_weight() bytes shared by every product, when the backward needs them
  size_t weight_cache_bytes(bool transposed_too = true) const;
  size_t largest_weight() const;
  // owners: with p shared by every layer's block (recompute 3, training's FP8 weight copies not kept), one
  // slot per product saying whose weight its part holds (Fp8Product::set_weight_cache)
  void set_weight_cache(void* p, void* transposed = nullptr, const void** owners = nullptr);
  // Whether every FP8 weight copy holds this version of the parameters with the current scales (true
  // without FP8 products); the FP8 products' weights in the layer's bucket, with their scaling
  bool fp8_weights_current(uint64_t params_version) const;
  std::vector<Fp8WeightRange> fp8_weights() const;
  // ln1(res_in) is in a.ln1 already; leaves fcproj's output in io.scratch_c (not in Pass::recompute).
  void forward(const LayerCtx& c, const BucketView& w, uint64_t params_version, const BlockActs& a,
               const BlockIo& io, Pass pass) const;
  // io.dres holds d(loss)/d(res3) and io.dres_colsum its column sums; afterwards d/d(res_in) (and its
  // column sums for layers above the first). At recompute 3 the block's forward runs again first, from
  // io.res_in (params_version: the forward's, whose FP8 weight copies are still current).
  void backward(const LayerCtx& c, const BucketView& w, const BucketView& g, uint64_t params_version,
                const BlockActs& a, const BlockIo& io) const;
  // The first LayerNorm's FP8 form (the qkv product's input scale), or null in bf16
  bool ln1_fp8() const { return qkv_.fp8(); }
  Fp8Tensor ln1_q(void* data, bool record) const { return qkv_.input_q(data, record); }
  const Norm& ln1() const { return ln1_; }

 private:
  // GELU's output leaves fc's epilogue in FP8 (both MLP products FP8, nothing recomputed, the policy's choice)
  bool gelu_in_fp8(const LayerCtx& c) const {
    return gelu_epilogue_ && fc_.fp8() && fcproj_.fp8() && c.recompute < 1;
  }

  int layer_, C_;
  bool gelu_epilogue_;
  Norm ln1_, ln2_;
  Linear qkv_, attproj_, fc_, fcproj_;
  Attention attn_;
};

}  // namespace gpt
