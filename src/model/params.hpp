// The parameter table and the layout built from it.
//
// kParams (params.cpp) lists every parameter tensor of the model once, with everything the code needs to
// know about it: its shape, how it is initialised, whether weight decay applies, which FP8 product it is
// the weight of, and its names in llm.c model files and Hugging Face GPT-2 folders. The layout, the
// initialisation (init.cpp), the optimizer's decay ranges, the FP8 weight casts, both file formats
// (io/modelfile.cpp, io/hf.cpp) and the parameter count of the FLOP convention all read it; no other code
// lists parameters or relies on their order.
//
// The layout places every parameter in one flat logical vector of buckets, layer-major: the embedding
// bucket, one bucket per layer, the final LayerNorm's. Inside a bucket tensors follow the table's order
// (decayed matrices first, so the decayed part of any range is one run), each at an offset aligned to
// kAlign elements; bucket sizes do not depend on the world size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/presets.hpp"

namespace gpt {

enum class Scope : uint8_t { embedding, layer, final };  // which bucket(s) a tensor lives in
// A tensor dimension in terms of the model's: Vp the padded vocabulary, T max_seq_len, C n_embd.
enum class Dim : uint8_t { one, Vp, T, C, C3, C4 };
// normal: N(0, init_std); residual: N(0, init_std / sqrt(2 n_layer)) (the projections into the residual
// stream); ones and zeros: norm weights and biases.
enum class Init : uint8_t { normal, residual, ones, zeros };

struct ParamSpec {
  const char* name;         // this trainer's name, and llm.c's
  Scope scope;
  Dim rows, cols;           // cols Dim::one: a vector of `rows` elements
  Init init;
  bool decay;               // weight decay applies (the 2-D weights)
  bool vocab_rows;          // rows are the padded vocabulary: rows >= vocab_size are padding (zero, never
                            // initialised, exported or counted)
  const char* product;      // the block product this tensor is the weight of ("qkv", ...; FP8 casts it and
                            // scales it under that name), or nullptr
  int llmc_rank;            // position in llm.c's tensor-major file order
  const char* hf;           // Hugging Face GPT2LMHeadModel name, "{l}" standing for the layer
  bool hf_transposed;       // Hugging Face stores it (in, out) (Conv1D) against this trainer's (out, in)
  // which models have it: nullptr, every one; else those for which it returns true (a structural choice's
  // tensors: params.cpp's predicates)
  bool (*when)(const ModelDims&) = nullptr;
  bool in(const ModelDims& d) const { return when == nullptr || when(d); }
};

// The table itself, in layout order.
const std::vector<ParamSpec>& param_table();

struct TensorInfo {
  const ParamSpec* spec;
  const char* name;           // spec->name
  size_t offset;              // within its bucket, elements
  size_t numel;
  std::vector<int> shape;     // (rows, cols) or (rows)
  bool decay;
  size_t real_numel;          // numel without the vocabulary's padding rows
  int real_rows() const { return int(real_numel / (shape.size() > 1 ? size_t(shape[1]) : 1)); }
};

// Buckets: 0 = embedding, 1..L = layers, L+1 = final LayerNorm. Alignment gaps are always zero.
struct Bucket {
  Scope scope;
  size_t size = 0;            // elements incl. alignment gaps
  size_t decayed = 0;         // elements [0, decayed) are the decayed tensors (and their gaps)
  std::vector<TensorInfo> tensors;
  const TensorInfo& tensor(const std::string& name) const;  // throws when the bucket has none of that name
};

class ParamLayout {
 public:
  static constexpr size_t kAlign = 64;
  explicit ParamLayout(const ModelDims& d);
  int n_buckets() const { return int(buckets_.size()); }
  const Bucket& bucket(int b) const { return buckets_[b]; }
  int layer_bucket(int l) const { return 1 + l; }
  int final_bucket() const { return n_buckets() - 1; }
  // The bucket holding a tensor of this scope (layer: layer l's)
  int bucket_of(Scope s, int layer) const;
  size_t total() const;                // sum of bucket sizes (the logical flat length)
  size_t logical_offset(int b) const;  // start of bucket b in the logical flat index
  size_t n_params() const;             // real parameters (no alignment gaps, no vocab padding rows)
  const ModelDims& dims() const { return d_; }

  // Every tensor of the model (one per layer for layer tensors), in the table's order within each bucket
  struct Placed {
    const TensorInfo* t;
    int bucket, layer;                 // layer -1 outside the layers
    size_t logical;                    // logical offset of its first element
  };
  std::vector<Placed> placed() const;

 private:
  ModelDims d_;
  std::vector<Bucket> buckets_;
};

// FLOPs per token of a training step by the usual convention: 6 per parameter (2 forward, 4 backward)
// plus attention's 6 * n_layer * n_embd * seq_len.
double flops_per_token(const ParamLayout& layout, int seq_len);

// A bucket's tensors as text, in layout order: "name offset numel" per tensor, ';'-separated (what a checkpoint
// records per bucket and a resume compares)
std::string tensor_names(const Bucket& b);

// The Hugging Face name of a table row for layer l ("{l}" replaced)
std::string hf_name(const ParamSpec& s, int layer);

}  // namespace gpt
