// GPT-2 as layers (model/layers.hpp, model/block.hpp, model/classifier.hpp) over the Backend ops and a
// ParamStore that hands out each bucket's parameters and gradients (model/param_store.hpp): the
// embeddings, the blocks, the final LayerNorm and the tied classifier with its loss. One forward, backward and recomputation path
// for every precision; the model owns the activations and hands each layer its buffers.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "model/block.hpp"
#include "model/classifier.hpp"
#include "model/fp8_scaling.hpp"
#include "model/param_store.hpp"
#include "model/params.hpp"
#include "model/spec.hpp"

namespace gpt {

// The scaled tensors a policy's model registers (Fp8Scaling): an input, a weight and an output gradient
// for each FP8 product (four per FP8 layer, three for the classifier)
size_t fp8_scaled_tensors(const ModelSpec& spec);

// Activation memory for one micro-batch shape, in bytes (what GPT allocates).
struct ActivationBytes {
  size_t stored = 0;     // kept from forward for backward (and the FP8 weight copies)
  size_t scratch = 0;    // logits chunk, gradient scratch, inputs
};
// chunk_rows: the classifier's rows of logits at a time (training.logits_chunk; 0 there: the default)
constexpr int kDefaultLogitsChunk = 8192;
inline int logits_chunk_rows(int key) { return key > 0 ? key : kDefaultLogitsChunk; }
ActivationBytes activation_bytes(const ModelSpec& spec, int B, int T, int recompute, DType act,
                                 int chunk_rows = kDefaultLogitsChunk);

class GPT {
 public:
  // fp8 non-null when the spec has FP8 products: their scaled tensors are registered there.
  GPT(const ModelSpec& spec, const ParamLayout& layout, Backend& be, int B, int T, int recompute,
      Fp8Scaling* fp8 = nullptr, int chunk_rows = kDefaultLogitsChunk);
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
  int T() const { return T_; }
  int vocab_size() const { return d_.vocab_size; }
  size_t stored_bytes() const { return stored_bytes_; }    // activations kept for backward
  size_t scratch_bytes() const { return scratch_bytes_; }  // logits chunk, gradient scratch, inputs
  // Layer l's FP8 products' weights in its bucket with their scaling (empty without FP8 products): what
  // a store that gathers FP8 weights as FP8 casts (ParamStore::fp8_params)
  std::vector<Fp8WeightRange> fp8_weights(int l) const { return blocks_[l].fp8_weights(); }

 private:
  struct Acts;
  void trunk(ParamStore& ps, const int* tokens, bool train);  // embeddings, blocks, final LayerNorm -> lnf
  // res3 = res2 + the block's output, and the next LayerNorm on it (the next block's ln1, or the final one)
  void next_layernorm(ParamStore& ps, int l, bool train);
  BlockIo io(int l) const;
  ClassifierActs head_acts() const;
  BucketView params_of(ParamStore& ps, int b) const;
  BucketView grads_of(ParamStore& ps, int b) const;

  ModelDims d_;
  const ParamLayout& layout_;
  Backend& be_;
  int B_, T_;
  int chunk_rows_;
  LayerCtx ctx_;
  Fp8Scaling* fp8_;  // null without FP8 layers
  std::vector<Block> blocks_;
  Norm lnf_;
  Classifier head_;   // registers its FP8 tensors after the blocks'
  size_t wte_, wpe_;  // offsets in the embedding bucket
  std::unique_ptr<Acts> a_;
  std::vector<float> losses_host_;
  size_t stored_bytes_ = 0, scratch_bytes_ = 0;
  std::array<const void*, 4> w8_owners_{};  // one layer's FP8 weight copies for all: whose each product's part holds
};

}  // namespace gpt
