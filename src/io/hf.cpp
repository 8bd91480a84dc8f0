#include "io/hf.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "base/common.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;

namespace gpt {

namespace {

// One HF tensor: its name, the trainer's tensor and layer (-1: not per layer), and whether HF stores it
// transposed (Conv1D (in, out) against the trainer's (out, in)).
struct HfTensor {
  std::string name;
  P id;
  int layer;
  bool transposed;
};

std::vector<HfTensor> hf_tensors(int n_layer) {
  std::vector<HfTensor> t = {{"transformer.wte.weight", P::wte, -1, false},
                             {"transformer.wpe.weight", P::wpe, -1, false}};
  const std::pair<const char*, P> plain[] = {{"ln_1.weight", P::ln1w},        {"ln_1.bias", P::ln1b},
                                             {"attn.c_attn.bias", P::qkvb},   {"attn.c_proj.bias", P::attprojb},
                                             {"ln_2.weight", P::ln2w},        {"ln_2.bias", P::ln2b},
                                             {"mlp.c_fc.bias", P::fcb},       {"mlp.c_proj.bias", P::fcprojb}};
  const std::pair<const char*, P> conv[] = {{"attn.c_attn.weight", P::qkvw}, {"attn.c_proj.weight", P::attprojw},
                                            {"mlp.c_fc.weight", P::fcw},     {"mlp.c_proj.weight", P::fcprojw}};
  for (int l = 0; l < n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    for (auto& [n, id] : plain) t.push_back({h + n, id, l, false});
    for (auto& [n, id] : conv) t.push_back({h + n, id, l, true});
  }
  t.push_back({"transformer.ln_f.weight", P::lnfw, -1, false});
  t.push_back({"transformer.ln_f.bias", P::lnfb, -1, false});
  return t;
}

// Where the tensor lives in the logical vector, and its HF shape (wte: the real vocab_size rows only).
struct Place {
  size_t offset;
  std::vector<int64_t> shape;  // HF's
  int rows, cols;              // the trainer's matrix (rows x cols); 1-D tensors are 1 x n
};

Place place_of(const ParamLayout& L, const HfTensor& h) {
  const int b = h.id == P::wte || h.id == P::wpe ? 0 : h.layer < 0 ? L.final_bucket() : L.layer_bucket(h.layer);
  const TensorInfo& t = L.bucket(b).tensor(h.id);
  Place p{L.logical_offset(b) + t.offset, {}, 1, int(t.numel)};
  if (t.shape.size() == 2) {
    p.rows = h.id == P::wte ? L.dims().vocab_size : t.shape[0];
    p.cols = t.shape[1];
  }
  if (t.shape.size() == 1) p.shape = {p.cols};
  else if (h.transposed) p.shape = {p.cols, p.rows};
  else p.shape = {p.rows, p.cols};
  return p;
}

nlohmann::json hf_config(const ModelDims& d) {
  // GPT-2's <|endoftext|> (50256) begins and ends documents; a smaller vocabulary has no such token
  const nlohmann::json eot = d.vocab_size > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  return {{"bos_token_id", eot},
          {"eos_token_id", eot},
          {"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", d.vocab_size},
          {"n_positions", d.max_seq_len},
          {"n_ctx", d.max_seq_len},
          {"n_embd", d.n_embd},
          {"n_layer", d.n_layer},
          {"n_head", d.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},  // GELU's tanh approximation, as both backends compute it
          {"layer_norm_epsilon", 1e-5},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

void write_hf_model(const std::string& dir, const ParamLayout& L, const std::vector<float>& logical, bool bf16) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw input_error("cannot create folder '" + dir + "'");
  std::vector<TensorOut> out;
  for (const HfTensor& h : hf_tensors(L.dims().n_layer)) {
    const Place p = place_of(L, h);
    const float* src = logical.data() + p.offset;
    out.push_back({h.name, p.shape, [p, src, transposed = h.transposed](float* dst) {
                     for (int r = 0; r < p.rows; ++r)
                       for (int c = 0; c < p.cols; ++c) {
                         const size_t to = transposed ? size_t(c) * p.rows + r : size_t(r) * p.cols + c;
                         dst[to] = src[size_t(r) * p.cols + c];
                       }
                   }});
  }
  write_safetensors(dir + "/model.safetensors", out, bf16, {{"format", "pt"}});
  nlohmann::json cfg = hf_config(L.dims());
  if (bf16) cfg["torch_dtype"] = "bfloat16";
  write_file_whole(dir + "/config.json", cfg.dump(2) + "\n");
}

std::vector<float> read_hf_model(const std::string& dir, const ParamLayout& L) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/model.safetensors";
  nlohmann::json cfg;
  try {
    std::ifstream in(cfg_path);
    cfg = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw input_error("model.init_from: '" + cfg_path + "' is not valid JSON: " + e.what());
  }
  if (cfg.value("model_type", std::string()) != "gpt2")
    throw input_error("model.init_from: '" + cfg_path + "' has model_type '" + cfg.value("model_type", std::string()) +
                      "', expected gpt2");
  const ModelDims& d = L.dims();
  const std::pair<const char*, int> want[] = {{"n_layer", d.n_layer},       {"n_head", d.n_head},
                                              {"n_embd", d.n_embd},         {"vocab_size", d.vocab_size},
                                              {"n_positions", d.max_seq_len}};
  for (auto& [k, v] : want) {
    const int got = cfg.value(k, -1);
    if (got != v)
      throw input_error("model.init_from: '" + cfg_path + "': " + k + " is " + std::to_string(got) +
                        " but the config says " + std::to_string(v));
  }
  if (!fs::exists(st_path))
    throw input_error("model.init_from: '" + dir +
                      "' has no model.safetensors (a sharded or .bin checkpoint is not read)");
  const SafetensorsReader st(st_path);
  std::vector<float> out(L.total(), 0.0f);  // padded vocabulary rows and alignment gaps stay zero
  for (const HfTensor& h : hf_tensors(d.n_layer)) {
    std::string name = h.name;
    if (!st.has(name) && st.has(name.substr(12))) name = name.substr(12);  // without "transformer."
    const Place p = place_of(L, h);
    if (!st.has(name)) throw input_error("model.init_from: '" + st_path + "' lacks tensor '" + h.name + "'");
    if (st.shape(name) != p.shape)
      throw input_error("model.init_from: '" + st_path + "' tensor '" + name + "' has another shape than this model's");
    const std::vector<float> v = st.read(name);
    float* dst = out.data() + p.offset;
    for (int r = 0; r < p.rows; ++r)
      for (int c = 0; c < p.cols; ++c)
        dst[size_t(r) * p.cols + c] = v[h.transposed ? size_t(c) * p.rows + r : size_t(r) * p.cols + c];
  }
  return out;
}

}  // namespace gpt
