#include "model/params.hpp"

#include "base/common.hpp"

namespace gpt {

namespace {
// The structural choices' tensors (the last column): which models have them
bool with_bias(const ModelDims& d) { return d.bias; }
bool with_norm_bias(const ModelDims& d) { return d.bias && d.norm == NormKind::layernorm; }
bool untied_head(const ModelDims& d) { return !d.tied_head; }
bool learned_positions(const ModelDims& d) { return d.pos_embedding == PosEmbedding::learned; }

// GPT-2. Within each bucket, decayed matrices first (see params.hpp); llm.c's order is its own column.
const std::vector<ParamSpec> kParams = {
    // name       scope             rows      cols      init            decay  vocab  product    llmc  Hugging Face name                         Conv1D in the model
    {"wte",      Scope::embedding, Dim::Vp,  Dim::C,   Init::normal,   true,  true,  nullptr,   0,  "transformer.wte.weight",               false},
    {"wpe",      Scope::embedding, Dim::T,   Dim::C,   Init::normal,   true,  false, nullptr,   1,  "transformer.wpe.weight",               false, learned_positions},
    {"lmhead",   Scope::embedding, Dim::Vp,  Dim::C,   Init::normal,   true,  true,  nullptr,   16, "lm_head.weight",                       false, untied_head},
    {"qkvw",     Scope::layer,     Dim::C3,  Dim::C,   Init::normal,   true,  false, "qkv",     4,  "transformer.h.{l}.attn.c_attn.weight", true},
    {"attprojw", Scope::layer,     Dim::C,   Dim::C,   Init::residual, true,  false, "attproj", 6,  "transformer.h.{l}.attn.c_proj.weight", true},
    {"fcw",      Scope::layer,     Dim::C4,  Dim::C,   Init::normal,   true,  false, "fc",      10, "transformer.h.{l}.mlp.c_fc.weight",    true},
    {"fcprojw",  Scope::layer,     Dim::C,   Dim::C4,  Init::residual, true,  false, "fcproj",  12, "transformer.h.{l}.mlp.c_proj.weight",  true},
    {"ln1w",     Scope::layer,     Dim::C,   Dim::one, Init::ones,     false, false, nullptr,   2,  "transformer.h.{l}.ln_1.weight",        false},
    {"ln1b",     Scope::layer,     Dim::C,   Dim::one, Init::zeros,    false, false, nullptr,   3,  "transformer.h.{l}.ln_1.bias",          false, with_norm_bias},
    {"qkvb",     Scope::layer,     Dim::C3,  Dim::one, Init::zeros,    false, false, nullptr,   5,  "transformer.h.{l}.attn.c_attn.bias",   false, with_bias},
    {"attprojb", Scope::layer,     Dim::C,   Dim::one, Init::zeros,    false, false, nullptr,   7,  "transformer.h.{l}.attn.c_proj.bias",   false, with_bias},
    {"ln2w",     Scope::layer,     Dim::C,   Dim::one, Init::ones,     false, false, nullptr,   8,  "transformer.h.{l}.ln_2.weight",        false},
    {"ln2b",     Scope::layer,     Dim::C,   Dim::one, Init::zeros,    false, false, nullptr,   9,  "transformer.h.{l}.ln_2.bias",          false, with_norm_bias},
    {"fcb",      Scope::layer,     Dim::C4,  Dim::one, Init::zeros,    false, false, nullptr,   11, "transformer.h.{l}.mlp.c_fc.bias",      false, with_bias},
    {"fcprojb",  Scope::layer,     Dim::C,   Dim::one, Init::zeros,    false, false, nullptr,   13, "transformer.h.{l}.mlp.c_proj.bias",    false, with_bias},
    {"lnfw",     Scope::final,     Dim::C,   Dim::one, Init::ones,     false, false, nullptr,   14, "transformer.ln_f.weight",              false},
    {"lnfb",     Scope::final,     Dim::C,   Dim::one, Init::zeros,    false, false, nullptr,   15, "transformer.ln_f.bias",                false, with_norm_bias},
};

int dim_value(Dim x, const ModelDims& d) {
  switch (x) {
    case Dim::one: return 1;
    case Dim::Vp: return d.padded_vocab;
    case Dim::T: return d.max_seq_len;
    case Dim::C: return d.n_embd;
    case Dim::C3: return 3 * d.n_embd;
    case Dim::C4: return 4 * d.n_embd;
  }
  return 0;
}
}  // namespace

const std::vector<ParamSpec>& param_table() { return kParams; }

std::string tensor_names(const Bucket& b) {
  std::string s;
  for (const TensorInfo& t : b.tensors)
    s += (s.empty() ? "" : ";") + std::string(t.name) + " " + std::to_string(t.offset) + " " + std::to_string(t.numel);
  return s;
}

const TensorInfo& Bucket::tensor(const std::string& name) const {
  for (auto& t : tensors)
    if (name == t.name) return t;
  throw Error(kExitFailure, "internal error: no tensor '" + name + "' in this bucket");
}

ParamLayout::ParamLayout(const ModelDims& d) : d_(d) {
  auto make = [&](Scope scope) {
    Bucket b;
    b.scope = scope;
    for (const ParamSpec& s : kParams) {
      if (s.scope != scope || !s.in(d)) continue;
      TensorInfo t{&s, s.name, b.size, 0, {dim_value(s.rows, d)}, s.decay, 0};
      if (s.cols != Dim::one) t.shape.push_back(dim_value(s.cols, d));
      t.numel = 1;
      for (int x : t.shape) t.numel *= size_t(x);
      t.real_numel = s.vocab_rows ? t.numel / size_t(t.shape[0]) * size_t(d.vocab_size) : t.numel;
      b.size += (t.numel + kAlign - 1) / kAlign * kAlign;
      if (s.decay) b.decayed = b.size;
      b.tensors.push_back(t);
    }
    return b;
  };
  buckets_.push_back(make(Scope::embedding));
  for (int l = 0; l < d.n_layer; ++l) buckets_.push_back(make(Scope::layer));
  buckets_.push_back(make(Scope::final));
}

int ParamLayout::bucket_of(Scope s, int layer) const {
  return s == Scope::embedding ? 0 : s == Scope::final ? final_bucket() : layer_bucket(layer);
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
    for (auto& t : b.tensors) n += t.real_numel;
  return n;
}

std::vector<ParamLayout::Placed> ParamLayout::placed() const {
  std::vector<Placed> out;
  for (int b = 0; b < n_buckets(); ++b) {
    const int layer = buckets_[b].scope == Scope::layer ? b - 1 : -1;
    for (const TensorInfo& t : buckets_[b].tensors) out.push_back({&t, b, layer, logical_offset(b) + t.offset});
  }
  return out;
}

double flops_per_token(const ParamLayout& layout, int seq_len) {
  const ModelDims& d = layout.dims();
  // the parameters once each through forward and backward, the token embedding a lookup (counted as the
  // head's matrix when tied; the head's own counts when not), and attention's scores and values
  const double lookup = d.tied_head ? 0.0 : double(d.vocab_size) * d.n_embd;
  return 6.0 * (double(layout.n_params()) - lookup) + 6.0 * d.n_layer * d.n_embd * double(seq_len);
}

std::string hf_name(const ParamSpec& s, int layer) {
  std::string n = s.hf;
  const size_t at = n.find("{l}");
  if (at != std::string::npos) n.replace(at, 3, std::to_string(layer));
  return n;
}

}  // namespace gpt
