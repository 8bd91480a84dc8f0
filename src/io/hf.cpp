#include "io/hf.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <utility>

#include "base/common.hpp"
#include "base/input_file.hpp"
#include "io/bpe.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;

namespace gpt {

namespace {

// One Hugging Face tensor: its name, where it lives in the logical vector, and its shape there.
struct HfTensor {
  std::string name;
  size_t offset;
  std::vector<int64_t> shape;  // Hugging Face's (wte: the real vocab_size rows only)
  int rows, cols;              // the trainer's matrix (rows x cols); 1-D tensors are 1 x n
  bool transposed;             // Conv1D: Hugging Face stores (cols, rows)
};

// Every tensor of the model, named and shaped from the parameter table's Hugging Face columns.
std::vector<HfTensor> hf_tensors(const ParamLayout& L) {
  std::vector<HfTensor> out;
  for (const ParamLayout::Placed& p : L.placed()) {
    const TensorInfo& t = *p.t;
    HfTensor h{hf_name(*t.spec, p.layer), p.logical, {}, 1, int(t.numel), t.spec->hf_transposed};
    if (t.shape.size() == 2) {
      h.rows = t.real_rows();
      h.cols = t.shape[1];
      h.shape = h.transposed ? std::vector<int64_t>{h.cols, h.rows} : std::vector<int64_t>{h.rows, h.cols};
    } else {
      h.shape = {h.cols};
    }
    out.push_back(h);
  }
  return out;
}

// GPT-2's BPE: 50257 tokens, the last <|endoftext|>, which begins and ends every document
constexpr int kGpt2Vocab = 50257;
constexpr int kEndOfText = 50256;
const char* const kEndOfTextText = "<|endoftext|>";

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
          {"tie_word_embeddings", d.tied_head},  // untied: lm_head.weight is in the folder
          // transformers 4.56 and later read `dtype` (and prefer it), earlier versions only `torch_dtype`
          {"dtype", "float32"},
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
  for (const HfTensor& p : hf_tensors(L)) {
    const float* src = logical.data() + p.offset;
    out.push_back({p.name, p.shape, [p, src, transposed = p.transposed](float* dst) {
                     for (int r = 0; r < p.rows; ++r)
                       for (int c = 0; c < p.cols; ++c) {
                         const size_t to = transposed ? size_t(c) * p.rows + r : size_t(r) * p.cols + c;
                         dst[to] = src[size_t(r) * p.cols + c];
                       }
                   }});
  }
  write_safetensors(dir + "/model.safetensors", out, bf16, {{"format", "pt"}});
  nlohmann::json cfg = hf_config(L.dims());
  if (bf16) cfg["dtype"] = cfg["torch_dtype"] = "bfloat16";
  write_file_whole(dir + "/config.json", cfg.dump(2) + "\n");
  if (L.dims().vocab_size > kEndOfText) {
    // what generate() stops on; as config.json says, and without it transformers derives the same
    const nlohmann::json gen = {{"bos_token_id", kEndOfText}, {"eos_token_id", kEndOfText}};
    write_file_whole(dir + "/generation_config.json", gen.dump(2) + "\n");
  } else {  // an earlier export's (--force) would end generation on a token this vocabulary lacks
    std::error_code ec;
    fs::remove(fs::path(dir) / "generation_config.json", ec);
    if (ec)
      throw input_error("cannot remove the earlier export's '" + dir + "/generation_config.json': " + ec.message());
  }
}

HfTokenizerSource hf_tokenizer_source(const ModelDims& d, const std::string& given_vocab,
                                      const std::string& given_merges, const std::string& run_vocab,
                                      const std::string& run_merges) {
  const bool given = !given_vocab.empty() || !given_merges.empty();
  const std::string vocab_text = std::to_string(d.vocab_size) + "-token vocabulary";
  if (d.vocab_size != kGpt2Vocab) {
    if (given)
      throw input_error(std::string(given_vocab.empty() ? "--merges" : "--vocab") + ": the model's " + vocab_text +
                        " is not GPT-2's BPE (" + std::to_string(kGpt2Vocab) +
                        " tokens): there is no tokenizer of it to write");
    return {"", "", "",
            "no tokenizer files: the model's " + vocab_text + " is not GPT-2's BPE (" + std::to_string(kGpt2Vocab) +
                " tokens); give AutoTokenizer the tokenizer it was trained with"};
  }
  const std::string vocab = given ? given_vocab : run_vocab, merges = given ? given_merges : run_merges;
  const std::string from = merges.empty() ? vocab : vocab + " and " + merges;
  const std::string merges_key = given ? "--merges" : "eval.merges";
  const std::string named =
      merges.empty() ? "'" + vocab + "'" : "'" + vocab + "' and " + merges_key + " '" + merges + "'";
  const std::string what = (given ? "--vocab " : "the run's eval.vocab ") + named;
  const std::string pass =
      "pass --vocab DIR (a folder with GPT-2's vocab.json and merges.txt) or --vocab FILE --merges FILE";
  if (vocab.empty() && merges.empty())
    return {"", "", "", "no tokenizer files: " + pass + " to add them (the run has no eval.vocab)"};
  std::string vocab_json, merges_txt, problem;
  try {
    // the rule's errors name the flags (the run's keys are already checked when its config was read)
    std::tie(vocab_json, merges_txt) =
        gpt2_vocab_files(vocab, merges, given ? "--vocab" : "eval.vocab", given ? "--merges" : "eval.merges");
  } catch (const Error& e) {
    if (given) throw;
    problem = e.what();
  }
  if (problem.empty()) {
    try {
      const Gpt2Vocab v = merges.empty() ? Gpt2Vocab(vocab) : Gpt2Vocab(vocab_json, merges_txt);
      if (v.size() != kGpt2Vocab)
        problem = "its vocab.json holds " + std::to_string(v.size()) + " tokens, not GPT-2's " + std::to_string(kGpt2Vocab);
      else if (v.encode(kEndOfTextText) != std::vector<int>{kEndOfText})
        problem = std::string("its vocab.json does not have ") + kEndOfTextText + " as token " + std::to_string(kEndOfText);
    } catch (const Error& e) {
      // Gpt2Vocab names the config key it is read for at run time; here the files are named instead
      problem = e.what();
      for (const std::string key : {"eval.vocab: ", "eval.merges: "})
        if (problem.rfind(key, 0) == 0) problem.erase(0, key.size());
    }
  }
  if (problem.empty()) return {vocab_json, merges_txt, from, ""};
  if (given) throw input_error("--vocab: " + named + " cannot be the tokenizer: " + problem);
  return {"", "", "", "no tokenizer files: " + what + " cannot be used (" + problem + "); " + pass};
}

void write_hf_tokenizer(const std::string& dir, const ModelDims& d, const HfTokenizerSource& src) {
  for (const auto& [from, name] : {std::pair{src.vocab_json, "vocab.json"}, std::pair{src.merges_txt, "merges.txt"}}) {
    std::ifstream in(from, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) throw input_error("cannot read '" + from + "'");
    write_file_whole(dir + "/" + name, bytes);
  }
  // GPT2Tokenizer's settings for GPT-2 itself: no prefix space, <|endoftext|> for every special role
  const nlohmann::json eot = {{"content", kEndOfTextText}, {"lstrip", false}, {"normalized", true},
                              {"rstrip", false},           {"single_word", false}, {"special", true}};
  const nlohmann::json cfg = {{"tokenizer_class", "GPT2Tokenizer"},
                              {"model_max_length", d.max_seq_len},
                              {"add_prefix_space", false},
                              {"add_bos_token", false},
                              {"errors", "replace"},
                              {"clean_up_tokenization_spaces", false},
                              {"bos_token", kEndOfTextText},
                              {"eos_token", kEndOfTextText},
                              {"unk_token", kEndOfTextText},
                              {"added_tokens_decoder", {{std::to_string(kEndOfText), eot}}}};
  write_file_whole(dir + "/tokenizer_config.json", cfg.dump(2) + "\n");
  const nlohmann::json special = {{"bos_token", kEndOfTextText}, {"eos_token", kEndOfTextText},
                                  {"unk_token", kEndOfTextText}};
  write_file_whole(dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

void remove_hf_tokenizer(const std::string& dir) {
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
    std::error_code ec;
    fs::remove(fs::path(dir) / name, ec);
    if (ec) throw input_error("cannot remove the earlier export's '" + dir + "/" + name + "': " + ec.message());
  }
}

void check_hf_config(const std::string& dir, const ModelDims& d) {
  const std::string cfg_path = dir + "/config.json";
  const auto bad = [&](const std::string& why) { return input_error("model.init_from: '" + cfg_path + "' " + why); };
  check_input_file(cfg_path, "model.init_from");  // a FIFO would block the open
  std::ifstream in(cfg_path);
  if (!in) throw bad("cannot be read");
  nlohmann::json cfg;
  try {
    cfg = parse_json_unique_keys(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("is not valid JSON: ") + e.what());
  } catch (const Error& e) {
    throw bad(e.what());
  }
  if (!cfg.is_object()) throw bad(std::string("must hold a JSON object (GPT-2's config), not ") + cfg.type_name());
  const auto it = cfg.find("model_type");
  if (it == cfg.end() || !it->is_string() || it->get<std::string>() != "gpt2")
    throw bad("has model_type " + (it == cfg.end() ? std::string("missing") : it->dump()) + ", expected \"gpt2\"");
  const std::pair<const char*, int> want[] = {{"n_layer", d.n_layer},       {"n_head", d.n_head},
                                              {"n_embd", d.n_embd},         {"vocab_size", d.vocab_size},
                                              {"n_positions", d.max_seq_len}};
  for (auto& [k, v] : want) {
    const auto f = cfg.find(k);
    if (f == cfg.end()) throw bad(std::string("has no ") + k + " (the config says " + std::to_string(v) + ")");
    if (!f->is_number_integer()) throw bad(std::string(k) + " must be an integer, got " + f->dump());
    if (f->get<int64_t>() != v)
      throw bad(std::string(k) + " is " + f->dump() + " but the config says " + std::to_string(v));
  }
  // What transformers computes differently from this trainer when these keys say so; absent, each takes
  // GPT2Config's default, which is what this trainer computes.
  const auto given = [&](const char* k) -> const nlohmann::json* {
    const auto f = cfg.find(k);
    return f == cfg.end() ? nullptr : &*f;
  };
  const auto cannot = [&](const char* k, const std::string& what) {
    return bad(std::string(k) + " is " + given(k)->dump() + ", but " + what + ": this trainer cannot represent "
               "that model");
  };
  // transformers' names of GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which
  // both backends compute (base/gelu_logistic.hpp); "gelu" is the exact (erf) GELU
  if (const auto* a = given("activation_function");
      a && !(a->is_string() && (*a == "gelu_new" || *a == "gelu_pytorch_tanh" || *a == "gelu_fast")))
    throw cannot("activation_function", "this trainer computes GELU's tanh approximation (\"gelu_new\", also "
                                        "named \"gelu_pytorch_tanh\" and \"gelu_fast\")");
  if (const auto* e = given("layer_norm_epsilon");
      e && !(e->is_number() && std::fabs(e->get<double>() - 1e-5) <= 1e-11))
    throw cannot("layer_norm_epsilon", "this trainer's LayerNorm adds 1e-5");
  // absent: GPT2Config's default, tied
  if (const auto* t = given("tie_word_embeddings"); t && !t->is_boolean())
    throw bad("tie_word_embeddings must be true or false, got " + t->dump());
  else if (const bool tied = !t || *t == true; tied != d.tied_head)
    throw bad(tied ? std::string("tie_word_embeddings is ") + (t ? "true" : "absent (GPT-2's default, true)") +
                         " but model.tied_head is false: the folder has no lm_head.weight of its own to start from"
                   : "tie_word_embeddings is false, but this trainer's output head is wte itself under model.tied_head "
                     "true (set model.tied_head: false to start from the folder's own lm_head.weight)");
  if (const auto* n = given("n_inner"); n && !n->is_null() && !(n->is_number_integer() && *n == 4 * d.n_embd))
    throw cannot("n_inner", "this trainer's MLP has 4 n_embd = " + std::to_string(4 * d.n_embd) + " units");
  if (const auto* s = given("scale_attn_weights"); s && *s != true)
    throw cannot("scale_attn_weights", "this trainer scales attention scores by 1/sqrt(head size)");
  if (const auto* s = given("scale_attn_by_inverse_layer_idx"); s && *s != false)
    throw cannot("scale_attn_by_inverse_layer_idx", "this trainer scales every layer's attention alike");
}

namespace {

// Calls fn(tensor, place, values) for every tensor of the folder's model.safetensors, each checked: there
// (with or without the `transformer.` prefix), of the model's shape, every value finite.
template <class Fn>
void read_hf_tensors(const std::string& dir, const ParamLayout& L, Fn fn) {
  const std::string st_path = dir + "/model.safetensors";
  check_hf_config(dir, L.dims());
  if (!fs::exists(st_path))
    throw input_error("model.init_from: '" + dir +
                      "' has no model.safetensors (a sharded or .bin checkpoint is not read)");
  const SafetensorsReader st(st_path);
  for (const HfTensor& h : hf_tensors(L)) {
    std::string name = h.name;
    if (!st.has(name) && st.has(name.substr(12))) name = name.substr(12);  // without "transformer."
    if (!st.has(name)) throw input_error("model.init_from: '" + st_path + "' lacks tensor '" + h.name + "'");
    if (st.shape(name) != h.shape)
      throw input_error("model.init_from: '" + st_path + "' tensor '" + name + "' has another shape than this model's");
    const std::vector<float> v = st.read(name);
    // a NaN or an infinity would only show as a diverged first step
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        throw input_error("model.init_from: '" + st_path + "' tensor '" + name + "' holds " +
                          (std::isnan(v[i]) ? "NaN" : "an infinity") + " at element " + std::to_string(i) + " of " +
                          std::to_string(v.size()));
    fn(h, v);
  }
}

}  // namespace

std::vector<float> read_hf_model(const std::string& dir, const ParamLayout& L) {
  std::vector<float> out(L.total(), 0.0f);  // padded vocabulary rows and alignment gaps stay zero
  read_hf_tensors(dir, L, [&](const HfTensor& p, const std::vector<float>& v) {
    float* dst = out.data() + p.offset;
    for (int r = 0; r < p.rows; ++r)
      for (int c = 0; c < p.cols; ++c)
        dst[size_t(r) * p.cols + c] = v[p.transposed ? size_t(c) * p.rows + r : size_t(r) * p.cols + c];
  });
  return out;
}

void check_hf_model(const std::string& dir, const ModelDims& dims) {
  read_hf_tensors(dir, ParamLayout(dims), [](const HfTensor&, const std::vector<float>&) {});
}

}  // namespace gpt
