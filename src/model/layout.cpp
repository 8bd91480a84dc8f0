#include "model/layout.hpp"

#include <algorithm>
#include <array>
#include <tuple>
#include <cmath>
#include <map>
#include <numeric>

#include "base/common.hpp"
#include "config/config.hpp"

namespace gpt {

ModelDims resolve_dims(const ModelConfig& m) {
  // name -> (layers, heads, width)
  static const std::map<std::string, std::array<int, 3>> presets = {
      {"d12", {12, 12, 768}}, {"d24", {24, 16, 1024}}, {"d36", {36, 20, 1280}}, {"d48", {48, 25, 1600}},
      {"tiny", {2, 4, 64}}};
  ModelDims d;
  if (!m.preset.empty()) {
    auto it = presets.find(m.preset);
    if (it == presets.end())
      throw input_error("model.preset: '" + m.preset + "' is not one of d12, d24, d36, d48, tiny");
    if (m.n_layer || m.n_head || m.n_embd)
      throw input_error("model.preset: give either a preset or n_layer/n_head/n_embd, not both");
    d.n_layer = it->second[0];
    d.n_head = it->second[1];
    d.n_embd = it->second[2];
  } else {
    if (m.n_layer < 1) throw input_error("model.n_layer: must be >= 1 (or set model.preset)");
    if (m.n_head < 1) throw input_error("model.n_head: must be >= 1 (or set model.preset)");
    if (m.n_embd < 1) throw input_error("model.n_embd: must be >= 1 (or set model.preset)");
    d.n_layer = m.n_layer;
    d.n_head = m.n_head;
    d.n_embd = m.n_embd;
  }
  if (d.n_embd % d.n_head != 0)
    throw input_error("model.n_embd: " + std::to_string(d.n_embd) + " is not divisible by n_head " +
                      std::to_string(d.n_head));
  if (m.vocab_size < 2) throw input_error("model.vocab_size: must be >= 2");
  if (m.max_seq_len < 1) throw input_error("model.max_seq_len: must be >= 1");
  d.vocab_size = m.vocab_size;
  d.padded_vocab = (m.vocab_size + 127) / 128 * 128;
  d.max_seq_len = m.max_seq_len;
  return d;
}

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
