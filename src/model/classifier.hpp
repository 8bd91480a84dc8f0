// The lm head: GPT-2's output projection tied to the token embedding, logits (N, Vp) = x (N, C) @ wte^T
// (with model.tied_head false the head's own matrix `lmhead` in wte's place, in the same bucket)
// over the padded vocabulary, the fused softmax + cross-entropy, and in training its two gradient
// products, dx = dlogits @ wte and dwte += dlogits^T @ x. It runs chunk by chunk, at most chunk_rows rows
// of logits at a time, so the full-batch logits never exist.
//
// In the activation dtype the logits' gradient is written over the logits (Backend::classifier). In FP8
// (training.fp8_classifier) x arrives as FP8 bytes (the final LayerNorm writes it with input_q), wte's
// FP8 copy and its transpose are cast once per change of the parameters or the scales (as Linear's
// weights), the logits come out of the FP8 product in the activation dtype, and the loss kernel writes
// their gradient directly in FP8 with its own scale (ClassifierLoss::dlogits: a separate cast would cost as
// much as the FP8 product saves at GPT-2 124M). The weight gradient takes both operands transposed (FP8
// tensor cores take K-major operands only): the chunk's gradient bytes, transposed into the logits
// buffer (the bf16 logits are dead by then), and the chunk's x bytes. Scaled tensors: "classifier.input"
// (x, E4M3), "classifier.weight" (wte, E4M3), "classifier.grad" (the recipe's gradient format).
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/layers.hpp"

namespace gpt {

// What a classifier pass reads and writes (the model allocates it).
struct ClassifierActs {
  void* x;             // (N, C) the final LayerNorm's output; FP8 bytes when the classifier is FP8
  const int* targets;  // (N)
  float* losses;       // (N)
  void* logits;        // (chunk, Vp) activation dtype; FP8 training: then the gradient's bytes transposed (Vp, n)
  void* dx;            // (N, C) training: d(loss)/dx, overwritten
  void* dlogits_q;     // (chunk, Vp) FP8 bytes, FP8 training only: the logits' gradient
  void* x_t;           // (C, chunk) FP8 bytes, FP8 training only: the chunk's x transposed
};

class Classifier {
 public:
  // chunk_rows: the most rows of logits at a time (what the logits buffer holds)
  Classifier(const ParamLayout& L, int chunk_rows, LayerPrecision p);
  bool fp8() const { return q_.on(); }
  // The FP8 form of x (its scale), bytes at data: what the final LayerNorm writes x with. record false:
  // its amax is not recorded (evaluation).
  Fp8Tensor input_q(void* data, bool record) const { return q_.input(data, record); }
  // Bytes of wte's FP8 copies (wte and its transpose): 2 * Vp * C; 0 in the activation dtype.
  size_t weight_cache_bytes() const { return q_.weight_cache_bytes(); }
  void set_weight_cache(void* p) { q_.set_weight_cache(p); }

  // a.losses (N) for the N = c.N rows of a.x. With g (training): dloss = d(objective)/d(each row's loss),
  // a.dx overwritten, dwte accumulated into g. w, g: the embedding bucket's parameters and gradients.
  void forward(const LayerCtx& c, const BucketView& w, const BucketView* g, uint64_t params_version,
               const ClassifierActs& a, float dloss) const;
  // The vocab_size logits of row `row` of a.x, fp32, into host memory at out.
  void logits_row(const LayerCtx& c, const BucketView& w, uint64_t params_version, const ClassifierActs& a,
                  int row, float* out) const;

 private:
  size_t wte_;  // offset in the embedding bucket: wte, or lmhead when untied
  int C_, V_, Vp_, chunk_;
  Fp8Product q_;  // wte (Vp, C)
};

}  // namespace gpt
