// Model dimensions: a named preset (GPT-2 124M to 1558M, or a tiny one for tests) or explicit sizes.
#pragma once
#include "config/config.hpp"

namespace gpt {

struct ModelDims {
  int n_layer = 0, n_head = 0, n_embd = 0;
  int vocab_size = 0;         // V: real tokens
  int padded_vocab = 0;       // Vp: V rounded up to a multiple of 128
  int max_seq_len = 0;
  int head_dim() const { return n_embd / n_head; }
};

// Resolves model.preset or the explicit dims; throws an input error naming the key.
ModelDims resolve_dims(const ModelConfig& m);

}  // namespace gpt
