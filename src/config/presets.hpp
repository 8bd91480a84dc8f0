// Model dimensions: a named preset (GPT-2 124M to 1558M, or a tiny one for tests) or explicit sizes.
#pragma once
#include <string>
#include <vector>

#include "config/config.hpp"

namespace gpt {

struct ModelDims {
  int n_layer = 0, n_head = 0, n_embd = 0;
  int vocab_size = 0;         // V: real tokens
  int padded_vocab = 0;       // Vp: V rounded up to a multiple of 128
  int max_seq_len = 0;
  GPT_MODEL_STRUCTURE(GPT_STRUCTURE_FIELD)  // the structural choices (config/structure.hpp), as model.<name>
  int head_dim() const { return n_embd / n_head; }
};

// Where the model's structure is more than a GPT-2 file holds: the first structural key with its value
// ("model.norm rmsnorm"), or "" when the file can hold it. llm.c model files hold GPT-2 exactly; Hugging
// Face GPT-2 folders (hf_folder) also the choices whose row says `hf` (an untied head).
std::string non_gpt2_structure(const ModelConfig& m, bool hf_folder);
// The structural choices for the plan's model line, from their rows: "layernorm", "rmsnorm, no biases, untied head"
std::string structure_text(const ModelDims& d);

// Resolves model.preset or the explicit dims; throws an input error naming the key.
ModelDims resolve_dims(const ModelConfig& m);

// A set of layers as text ("all", "none", or numbers and ranges from 0: "1-46", "0,2-5") as one flag per
// layer of n_layer; throws an input error naming `key` on malformed text or a layer outside the model.
std::vector<bool> parse_layer_set(const std::string& text, int n_layer, const std::string& key);

// The set's canonical text, which parse_layer_set reads back: "all", "none", or ascending numbers and ranges
// ("0-3,5").
std::string layer_set_text(const std::vector<bool>& layers);

// A block's four products, in the block's order (the bits of a product set; training.fp8_products names them).
inline constexpr const char* kBlockProducts[] = {"qkv", "attproj", "fc", "fcproj"};
inline constexpr unsigned kAllBlockProducts = 0xF;
// A set of block products as text ("all", or names of kBlockProducts joined by ','), as one bit per product
// (bit p: kBlockProducts[p]); throws an input error naming `key` on an unknown or repeated name or an empty set.
unsigned parse_product_set(const std::string& text, const std::string& key);
// The set's canonical text, which parse_product_set reads back: "all", or names in the block's order; "none"
// for the empty set (which the key does not accept).
std::string product_set_text(unsigned set);

// The model's structure as named integers: what a checkpoint records (one attribute each) and a resume
// compares, so that a new structural choice is recorded and checked by being listed here. `absent`: the
// value of a file written before the attribute existed; `names`: the value's names for messages (enums).
struct SpecAttr {
  const char* name;    // the attribute; model.<name> is its key (padded_vocab: derived from vocab_size)
  int64_t value;
  int64_t absent = -1;  // -1: every file has it
  const char* const* names = nullptr;
  int n_names = 0;
  std::string text(int64_t v) const;  // v as the key's value
};
std::vector<SpecAttr> spec_attrs(const ModelDims& d);

}  // namespace gpt
