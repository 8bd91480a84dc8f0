#include "config/presets.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <map>
#include <string>

#include "base/common.hpp"
#include "base/format.hpp"

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
      throw input_error("model.preset: give either a preset or n_layer/n_head/n_embd, not both (model.preset=P on "
                        "the command line replaces the file's dims)");
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
  d.norm = m.norm;
  d.activation = m.activation;
  d.bias = m.bias;
  d.tied_head = m.tied_head;
  return d;
}

std::vector<bool> parse_layer_set(const std::string& text, int n_layer, const std::string& key) {
  if (text == "all") return std::vector<bool>(size_t(n_layer), true);
  std::vector<bool> set(size_t(n_layer), false);
  if (text == "none") return set;
  const std::string form = " (give `all`, `none`, or layer numbers and ranges from 0 such as `1-46` or `0,2-5`)";
  auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
      throw input_error(key + ": '" + text + "' is not a set of layers" + form);
    const int l = std::stoi(s);
    if (l >= n_layer)
      throw input_error(key + ": layer " + s + " is outside the model's " + std::to_string(n_layer) +
                        " layers (they are numbered 0-" + std::to_string(n_layer - 1) + ")");
    return l;
  };
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t dash = item.find('-');
    const int lo = number(item.substr(0, dash)), hi = dash == std::string::npos ? lo : number(item.substr(dash + 1));
    if (hi < lo) throw input_error(key + ": the range '" + item + "' runs backwards" + form);
    for (int l = lo; l <= hi; ++l) set[size_t(l)] = true;
    at = end + 1;
  }
  return set;
}

std::string layer_set_text(const std::vector<bool>& layers) {
  if (std::find(layers.begin(), layers.end(), false) == layers.end()) return "all";
  std::vector<int> in;
  for (size_t l = 0; l < layers.size(); ++l)
    if (layers[l]) in.push_back(int(l));
  return in.empty() ? "none" : ranges_text(in);
}

unsigned parse_product_set(const std::string& text, const std::string& key) {
  if (text == "all") return kAllBlockProducts;
  const std::string form = " (give `all`, or some of qkv, attproj, fc, fcproj joined by commas, e.g. `qkv,fc,fcproj`)";
  unsigned set = 0;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const auto* hit = std::find(std::begin(kBlockProducts), std::end(kBlockProducts), item);
    if (hit == std::end(kBlockProducts)) throw input_error(key + ": '" + text + "' is not a set of block products" + form);
    const unsigned bit = 1u << (hit - std::begin(kBlockProducts));
    if (set & bit) throw input_error(key + ": '" + text + "' names " + item + " twice" + form);
    set |= bit;
    at = end + 1;
  }
  return set;
}

std::string product_set_text(unsigned set) {
  if ((set & kAllBlockProducts) == kAllBlockProducts) return "all";
  std::string text;
  for (unsigned p = 0; p < std::size(kBlockProducts); ++p)
    if (set >> p & 1u) text += (text.empty() ? "" : ",") + std::string(kBlockProducts[p]);
  return text.empty() ? "none" : text;
}

namespace {
constexpr const char* kBoolNames[] = {"false", "true"};
}  // namespace

std::vector<SpecAttr> spec_attrs(const ModelDims& d) {
  return {{"n_layer", d.n_layer},
          {"n_head", d.n_head},
          {"n_embd", d.n_embd},
          {"vocab_size", d.vocab_size},
          {"padded_vocab", d.padded_vocab},
          {"max_seq_len", d.max_seq_len},
          {"norm", int64_t(d.norm), int64_t(NormKind::layernorm), EnumNames<NormKind>::names,
           int(std::size(EnumNames<NormKind>::names))},
          {"activation", int64_t(d.activation), int64_t(Activation::gelu), EnumNames<Activation>::names,
           int(std::size(EnumNames<Activation>::names))},
          {"bias", int64_t(d.bias), 1, kBoolNames, 2},
          {"tied_head", int64_t(d.tied_head), 1, kBoolNames, 2}};
}

std::string structure_text(const ModelDims& d) {
  const std::string act = d.activation == Activation::gelu ? "" : std::string(", ") + name_of(d.activation);
  return name_of(d.norm) + act + (d.bias ? "" : ", no biases") + (d.tied_head ? "" : ", untied head");
}

std::string non_gpt2_structure(const ModelConfig& m, bool hf_folder) {
  if (m.norm != NormKind::layernorm) return std::string("model.norm ") + name_of(m.norm);
  if (m.activation != Activation::gelu) return std::string("model.activation ") + name_of(m.activation);
  if (!m.bias) return "model.bias false";
  if (!m.tied_head && !hf_folder) return "model.tied_head false";
  return "";
}

std::string SpecAttr::text(int64_t v) const {
  return v >= 0 && v < n_names ? names[v] : std::to_string(v);
}

}  // namespace gpt
