// GPT-2's dimensions and the layer-major parameter layout: every parameter in one flat logical vector of
// buckets (embedding, one per layer, final LayerNorm), each tensor at a fixed offset of its bucket.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "config/presets.hpp"

namespace gpt {

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

}  // namespace gpt
