#include "config/presets.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

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
  if (m.pos_embedding == PosEmbedding::rope && (d.n_embd / d.n_head) % 2 != 0)
    throw input_error("model.pos_embedding: rope rotates pairs of a head's values, so the head size n_embd / n_head (" +
                      std::to_string(d.n_embd / d.n_head) + ") must be even");
  d.padded_vocab = (m.vocab_size + 127) / 128 * 128;
  d.max_seq_len = m.max_seq_len;
#define GPT_STRUCTURE_COPY(type, name, ...) d.name = m.name;
  GPT_MODEL_STRUCTURE(GPT_STRUCTURE_COPY)
#undef GPT_STRUCTURE_COPY
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

// A choice's values by name: a bool's false and true, an enum's names
template <class T>
std::pair<const char* const*, int> choice_names() {
  if constexpr (std::is_same_v<T, bool>) return {kBoolNames, 2};
  else return {EnumNames<T>::names, int(std::size(EnumNames<T>::names))};
}
template <class T>
const char* value_name(T v) {
  return choice_names<T>().first[int(v)];
}
// A choice's words on the plan's model line: a bool's `plan` (its value's name without); an enum's name,
// after `plan` when given
template <class T>
std::string choice_words(const char* plan, T v) {
  if (!plan) return value_name(v);
  if constexpr (std::is_same_v<T, bool>) return plan;
  else return std::string(plan) + " " + value_name(v);
}
}  // namespace

std::vector<SpecAttr> spec_attrs(const ModelDims& d) {
  std::vector<SpecAttr> a = {{"n_layer", d.n_layer},       {"n_head", d.n_head},
                             {"n_embd", d.n_embd},         {"vocab_size", d.vocab_size},
                             {"padded_vocab", d.padded_vocab}, {"max_seq_len", d.max_seq_len}};
#define GPT_STRUCTURE_ATTR(type, name, gpt2, ...)                                                        \
  a.push_back({#name, int64_t(d.name), int64_t(type(gpt2)), choice_names<type>().first, choice_names<type>().second});
  GPT_MODEL_STRUCTURE(GPT_STRUCTURE_ATTR)
#undef GPT_STRUCTURE_ATTR
  return a;
}

std::string structure_text(const ModelDims& d) {
  std::string s;
#define GPT_STRUCTURE_WORDS(type, name, gpt2, plan, always, ...)                                          \
  if (always || d.name != type(gpt2)) {                                                                   \
    s += (s.empty() ? "" : ", ") + choice_words<type>(plan, d.name);                                     \
  }
  GPT_MODEL_STRUCTURE(GPT_STRUCTURE_WORDS)
#undef GPT_STRUCTURE_WORDS
  return s;
}

std::string non_gpt2_structure(const ModelConfig& m, bool hf_folder) {
#define GPT_STRUCTURE_GPT2(type, name, gpt2, plan, always, hf, ...)                                       \
  if (m.name != type(gpt2) && !(hf && hf_folder)) return std::string("model." #name " ") + value_name(m.name);
  GPT_MODEL_STRUCTURE(GPT_STRUCTURE_GPT2)
#undef GPT_STRUCTURE_GPT2
  return "";
}

std::string SpecAttr::text(int64_t v) const {
  return v >= 0 && v < n_names ? names[v] : std::to_string(v);
}

}  // namespace gpt
