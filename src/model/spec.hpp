// The model as one value: its structure and the precision of each of its products.
//
// ModelSpec::dims (config/presets.hpp) holds the sizes and the structural choices (the rows of
// config/structure.hpp): what the parameter table, the layout, the initialisation, the FLOP count, the checkpoints
// (spec_attrs: one attribute each, compared by a resume, and each bucket's tensor names), the exports and
// init_from read.
// ModelSpec::precision says which products compute in FP8, per layer and per product: what the model
// builds, the memory prediction counts and the step-time model weighs. The plan derives both from the
// config (model.*; training.precision, fp8_layers, fp8_products, fp8_classifier, fp8_gelu_epilogue) and
// the model is built from this value alone.
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "config/presets.hpp"

namespace gpt {

// Which products compute in FP8, per layer and product (training.precision fp8 and its per-layer and
// per-product keys); all false: bf16/fp32.
enum class Product : uint8_t { qkv, attproj, fc, fcproj };  // a block's products (kBlockProducts' order)
struct PrecisionPolicy {
  bool fp8_linear = false;         // block products of the layers in fp8_layer (at least one) are FP8
  std::vector<bool> fp8_layer;     // per layer (training.fp8_layers); empty: every layer
  unsigned fp8_products = kAllBlockProducts;  // bit p: Product p is FP8 in those layers (training.fp8_products)
  bool fp8_classifier = false;     // the tied classifier's three products (training.fp8_classifier)
  bool fp8_gelu_epilogue = false;  // FP8 GELU output from fc's epilogue (training.fp8_gelu_epilogue)
  // recompute 3: each FP8 layer keeps its FP8 weight copies from the forward to its backward (false: one
  // layer's copies serve every layer, cast again in each block's backward: the same bytes, one weight cast
  // more a step, the other layers' bytes not held)
  bool fp8_weights_kept = true;
  bool any_fp8() const { return fp8_linear || fp8_classifier; }
  bool layer_fp8(int l) const { return fp8_linear && (fp8_layer.empty() || fp8_layer[size_t(l)]); }
  bool product_fp8(int l, Product p) const { return layer_fp8(l) && (fp8_products >> int(p) & 1u); }
  // How many of n_layer layers run product p in FP8, and whether every layer does
  int product_layer_count(int n_layer, Product p) const {
    return (fp8_products >> int(p) & 1u) ? fp8_layer_count(n_layer) : 0;
  }
  bool all_layers_product_fp8(Product p) const { return all_layers_fp8() && (fp8_products >> int(p) & 1u); }
  // The share of the block products' weights (and so of their FLOPs) that is FP8: qkv 3, attproj 1, fc 4,
  // fcproj 4 parts of a layer's 12
  double fp8_weight_share(int n_layer) const {
    static constexpr int kParts[] = {3, 1, 4, 4};
    int parts = 0;
    for (int p = 0; p < 4; ++p) parts += (fp8_products >> p & 1u) ? kParts[p] : 0;
    return double(fp8_layer_count(n_layer)) * parts / (12.0 * n_layer);
  }
  // How many of n_layer layers have FP8 products
  int fp8_layer_count(int n_layer) const {
    int n = 0;
    for (int l = 0; l < n_layer; ++l) n += layer_fp8(l);
    return n;
  }
  // Whether every layer's products are FP8 (none of them bf16)
  bool all_layers_fp8() const {
    return fp8_linear && std::find(fp8_layer.begin(), fp8_layer.end(), false) == fp8_layer.end();
  }
};

// The policy as the text of its keys, each canonical (presets.hpp: layer_set_text, product_set_text): what a
// checkpoint records (one string attribute each) and a resume compares. fp8_layers is "none" without FP8
// block products; fp8_weights_kept is left out (it changes memory, not a number).
struct PrecisionAttr {
  const char* name;  // the attribute; training.<name> is its key
  std::string value;
};
inline constexpr const char* kPrecisionAttrs[] = {"fp8_layers", "fp8_products", "fp8_classifier", "fp8_gelu_epilogue"};
inline std::vector<PrecisionAttr> precision_attrs(const PrecisionPolicy& p, int n_layer) {
  std::vector<bool> layers(size_t(n_layer), false);
  for (int l = 0; l < n_layer; ++l) layers[size_t(l)] = p.layer_fp8(l);
  const std::string values[] = {p.fp8_linear ? layer_set_text(layers) : "none", product_set_text(p.fp8_products),
                                p.fp8_classifier ? "true" : "false", p.fp8_gelu_epilogue ? "true" : "false"};
  std::vector<PrecisionAttr> attrs;
  for (size_t i = 0; i < std::size(kPrecisionAttrs); ++i) attrs.push_back({kPrecisionAttrs[i], values[i]});
  return attrs;
}
// The value of attribute `name` in attrs ("" where absent)
inline std::string precision_attr(const std::vector<PrecisionAttr>& attrs, const std::string& name) {
  for (const PrecisionAttr& a : attrs)
    if (name == a.name) return a.value;
  return "";
}

struct ModelSpec {
  ModelSpec() = default;
  // implicit from the dims alone: the model without FP8 products
  ModelSpec(const ModelDims& d, PrecisionPolicy p = {}) : dims(d), precision(std::move(p)) {}
  ModelDims dims;
  PrecisionPolicy precision;
};

}  // namespace gpt
