// GPT-2: dimensions, the layer-major parameter layout, and forward/backward written once over the
// Backend ops (see backend.hpp) and a ParamStore that hands out each layer's parameters and gradients
// (see zero.hpp: ZeRO stages decide where those live).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace gpt {

struct ModelConfig;

struct ModelDims {
  int n_layer = 0, n_head = 0, n_embd = 0;
  int vocab_size = 0;         // V: real tokens
  int padded_vocab = 0;       // Vp: V rounded up to a multiple of 128
  int max_seq_len = 0;
  int head_dim() const { return n_embd / n_head; }
};

// Resolves model.preset or the explicit dims; throws an input error naming the key.
ModelDims resolve_dims(const ModelConfig& m);

// Parameter tensors. Each layer's bucket lists its decayed 2-D weights first so that the decayed and
// non-decayed parts of any range are two runs.
enum class P : int {
  wte, wpe,                                                 // embedding bucket
  qkvw, attprojw, fcw, fcprojw,                             // layer bucket, weight-decayed
  ln1w, ln1b, qkvb, attprojb, ln2w, ln2b, fcb, fcprojb,     // layer bucket, not decayed
  lnfw, lnfb                                                // final bucket
};

struct TensorInfo {
  P id;
  const char* name;           // llm.c name
  size_t offset;              // within its bucket, elements
  size_t numel;
  std::vector<int> shape;
  bool decay;                 // AdamW weight decay applies
};

// Buckets: 0 = embedding (wte, wpe), 1..L = layers, L+1 = final LayerNorm. Offsets within a bucket
// are aligned to kAlign elements; bucket sizes are independent of the world size.
struct Bucket {
  size_t size = 0;            // elements incl. alignment gaps (gaps are always zero)
  std::vector<TensorInfo> tensors;
  const TensorInfo& tensor(P id) const;
};

class ParamLayout {
 public:
  static constexpr size_t kAlign = 64;
  explicit ParamLayout(const ModelDims& d);
  int n_buckets() const { return int(buckets_.size()); }
  const Bucket& bucket(int b) const { return buckets_[b]; }
  int layer_bucket(int l) const { return 1 + l; }
  int final_bucket() const { return n_buckets() - 1; }
  size_t total() const;              // sum of bucket sizes (the logical flat length)
  size_t logical_offset(int b) const;  // start of bucket b in the logical flat index
  size_t n_params() const;           // real parameters (no alignment gaps, no vocab padding rows)
  const ModelDims& dims() const { return d_; }

 private:
  ModelDims d_;
  std::vector<Bucket> buckets_;
};

// Who owns the parameters and gradients (ZeRO stages): the model asks per bucket.
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // The bucket's full parameters (act dtype), valid until release(b). May gather (stage 3).
  virtual const void* params(int b) = 0;
  virtual void release(int b) { (void)b; }
  // Announces that params(b) comes next, so a gather can start early.
  virtual void prefetch(int b) { (void)b; }
  // The buffer the backward pass accumulates bucket b's gradients into (act dtype, zeroed per step
  // or per micro-step as the store decides).
  virtual void* grads(int b) = 0;
  // The backward pass will not touch bucket b again in this micro-step.
  virtual void grads_done(int b) { (void)b; }
};

// Activation memory for one micro-batch shape, in bytes (what GPT allocates).
struct ActivationBytes {
  size_t stored = 0;     // kept from forward for backward
  size_t scratch = 0;    // logits chunk, gradient scratch, inputs
};
ActivationBytes activation_bytes(const ModelDims& d, int B, int T, int recompute, DType act);

class GPT {
 public:
  GPT(const ModelDims& d, const ParamLayout& layout, Backend& be, int B, int T, int recompute);
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
  int B() const { return B_; }
  size_t stored_bytes() const { return stored_bytes_; }    // activations kept for backward
  size_t scratch_bytes() const { return scratch_bytes_; }  // logits chunk, gradient scratch, inputs
  int T() const { return T_; }

 private:
  struct Acts;
  void trunk(ParamStore& ps, const int* tokens);  // embeddings, layers, final LayerNorm -> lnf
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
  Acts* a_;
  std::vector<float> losses_host_;
  size_t stored_bytes_ = 0, scratch_bytes_ = 0;
};

}  // namespace gpt
