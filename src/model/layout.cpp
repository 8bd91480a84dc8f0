#include "model/layout.hpp"

#include <algorithm>
#include <array>
#include <tuple>
#include <cmath>
#include <map>
#include <numeric>

#include "base/common.hpp"

namespace gpt {

const TensorInfo& Bucket::tensor(P id) const {
  for (auto& t : tensors)
    if (t.id == id) return t;
  throw Error(kExitFailure, "internal: tensor not in bucket");
}

ParamLayout::ParamLayout(const ModelDims& d) : d_(d) {
  const int C = d.n_embd, Vp = d.padded_vocab, T = d.max_seq_len;
  auto make = [](std::vector<std::tuple<P, const char*, std::vector<int>, bool>> spec) {
    Bucket b;
    for (auto& [id, name, shape, decay] : spec) {
      size_t n = 1;
      for (int s : shape) n *= size_t(s);
      b.tensors.push_back({id, name, b.size, n, shape, decay});
      b.size += (n + kAlign - 1) / kAlign * kAlign;
    }
    return b;
  };
  buckets_.push_back(make({{P::wte, "wte", {Vp, C}, true}, {P::wpe, "wpe", {T, C}, true}}));
  for (int l = 0; l < d.n_layer; ++l)
    buckets_.push_back(make({{P::qkvw, "qkvw", {3 * C, C}, true},
                             {P::attprojw, "attprojw", {C, C}, true},
                             {P::fcw, "fcw", {4 * C, C}, true},
                             {P::fcprojw, "fcprojw", {C, 4 * C}, true},
                             {P::ln1w, "ln1w", {C}, false},
                             {P::ln1b, "ln1b", {C}, false},
                             {P::qkvb, "qkvb", {3 * C}, false},
                             {P::attprojb, "attprojb", {C}, false},
                             {P::ln2w, "ln2w", {C}, false},
                             {P::ln2b, "ln2b", {C}, false},
                             {P::fcb, "fcb", {4 * C}, false},
                             {P::fcprojb, "fcprojb", {C}, false}}));
  buckets_.push_back(make({{P::lnfw, "lnfw", {C}, false}, {P::lnfb, "lnfb", {C}, false}}));
}

size_t ParamLayout::total() const {
  size_t s = 0;
  for (auto& b : buckets_) s += b.size;
  return s;
}

size_t ParamLayout::logical_offset(int b) const {
  size_t s = 0;
  for (int i = 0; i < b; ++i) s += buckets_[i].size;
  return s;
}

size_t ParamLayout::n_params() const {
  size_t n = 0;
  for (auto& b : buckets_)
    for (auto& t : b.tensors) n += t.numel;
  return n - size_t(d_.padded_vocab - d_.vocab_size) * d_.n_embd;
}

}  // namespace gpt
