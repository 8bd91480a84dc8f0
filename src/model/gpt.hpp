// GPT-2's forward and backward, written once over the Backend ops (backend/backend.hpp) and a
// ParamStore that hands out each layer's parameters and gradients (model/param_store.hpp).
#pragma once
#include <cstddef>
#include <vector>

#include "backend/backend.hpp"
#include "model/fp8_recipe.hpp"
#include "model/layout.hpp"
#include "model/param_store.hpp"

namespace gpt {

// Activation memory for one micro-batch shape, in bytes (what GPT allocates).
struct ActivationBytes {
  size_t stored = 0;     // kept from forward for backward
  size_t scratch = 0;    // logits chunk, gradient scratch, inputs
};
// fp8: training.precision fp8 (FP8 copies of the block inputs and weights, model/gpt_fp8.cpp).
ActivationBytes activation_bytes(const ModelDims& d, int B, int T, int recompute, DType act, bool fp8 = false);

class GPT {
 public:
  // fp8 non-null: the block products run in FP8 with its scales (training.precision fp8)
  GPT(const ModelDims& d, const ParamLayout& layout, Backend& be, int B, int T, int recompute,
      Fp8Recipe* fp8 = nullptr);
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  // Forward over one micro-batch (tokens, targets: B*T host ints). Returns the mean loss.
  // With train, dloss = d(objective)/d(each token's loss) and the lm-head backward runs here,
  // chunk by chunk, so full-batch logits are never held.
  float forward(ParamStore& ps, const int* tokens, const int* targets, bool train, float dloss);
  // Backward from the lm head's input gradient; accumulates into ps.grads(b).
  void backward(ParamStore& ps);
  // The vocab_size logits of one row (b*T + t) of a forward pass over tokens (B*T host ints).
  void logits_row(ParamStore& ps, const int* tokens, int row, float* out);
  // The B*T per-token losses of the last forward, on the host (multiple-choice scoring reads them).
  const std::vector<float>& token_losses() const { return losses_host_; }
  int B() const { return B_; }
  int vocab_size() const { return d_.vocab_size; }
  size_t stored_bytes() const { return stored_bytes_; }    // activations kept for backward
  size_t scratch_bytes() const { return scratch_bytes_; }  // logits chunk, gradient scratch, inputs
  int T() const { return T_; }

 private:
  struct Acts;
  void trunk(ParamStore& ps, const int* tokens, bool train);  // embeddings, layers, final LayerNorm -> lnf
  // One layer's block, bf16/fp32 or FP8 (gpt_fp8.cpp): from its first LayerNorm's output to the MLP's
  // projection in scratch_c
  struct View;
  void block_fwd(int l, const View& w);
  void block_bwd(int l, const View& w, const View& g);
  void block_fwd_fp8(ParamStore& ps, int l, const View& w, bool train);
  void block_bwd_fp8(int l, const View& w, const View& g);
  // The next LayerNorm of the residual stream after layer l (the next layer's ln1, or the final one)
  void next_layernorm(ParamStore& ps, int l, bool train);
  // FP8 copies of layer l's four weights (and their transposes), cast once per change of the
  // parameters or the scales
  void cast_weights_fp8(ParamStore& ps, int l, const View& w);
  Fp8Tensor weight_fp8(int l, Fp8Recipe::Product p, bool transposed) const;
  Fp8Tensor q(int l, Fp8Recipe::Product p, Fp8Recipe::Role r, void* data, bool record = true) const {
    return fp8_->tensor(l, p, r, data, record);
  }
  // The tensors of one bucket inside a buffer the store handed out (parameters or gradients),
  // asked for once per use of the bucket.
  struct View {
    const Bucket* bucket;
    char* base;
    size_t esz;
    void* operator()(P id) const { return base + bucket->tensor(id).offset * esz; }
  };
  View params_of(ParamStore& ps, int b) const;
  View grads_of(ParamStore& ps, int b) const;

  ModelDims d_;
  const ParamLayout& layout_;
  Backend& be_;
  int B_, T_, recompute_;
  int chunk_rows_;
  Fp8Recipe* fp8_;
  Acts* a_;
  std::vector<float> losses_host_;
  size_t stored_bytes_ = 0, scratch_bytes_ = 0;
};

}  // namespace gpt
