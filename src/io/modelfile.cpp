#include "io/modelfile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "base/common.hpp"
#include "base/input_file.hpp"
#include "io/hf.hpp"

namespace gpt {
namespace {

constexpr int32_t kModelMagic = 20240326;
constexpr int32_t kVersionF32 = 3, kVersionBF16 = 5;

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};

// Calls fn(logical_offset, numel, tensor, layer) for every tensor in llm.c's file order (the parameter
// table's llm.c column, each tensor holding all layers in turn; layer -1: not per layer).
template <class Fn>
void walk(const ParamLayout& L, Fn fn) {
  std::vector<ParamLayout::Placed> order = L.placed();
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.t->spec->llmc_rank < b.t->spec->llmc_rank;  // stable: layers stay in order
  });
  for (const auto& p : order) fn(p.logical, p.t->numel, *p.t, p.layer);
}

using File = std::unique_ptr<FILE, FileCloser>;

// Opens an llm.c model file and checks its header against the model's dimensions; returns whether it
// holds bf16 (else fp32), with the file positioned at the parameters.
bool open_model_file(const std::string& path, const ModelDims& d, File& f) {
  if (!d.tied_head)
    throw input_error("model.init_from: '" + path + "' is not a Hugging Face folder, and llm.c model files hold "
                      "GPT-2's tied head only: model.tied_head false starts from a Hugging Face GPT-2 folder with "
                      "tie_word_embeddings false");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw input_error("model.init_from: '" + path + "' is a folder without config.json (expected an llm.c model "
                      "file or a Hugging Face GPT-2 folder with config.json and model.safetensors)");
  check_input_file(path, "model.init_from");
  f.reset(std::fopen(path.c_str(), "rb"));
  if (!f) throw input_error("model.init_from: cannot open '" + path + "'");
  int32_t h[256];
  if (std::fread(h, 4, 256, f.get()) != 256) throw input_error("model file '" + path + "' is truncated (no header)");
  if (h[0] != kModelMagic)
    throw input_error("model file '" + path + "' has magic " + std::to_string(h[0]) + ", expected " +
                      std::to_string(kModelMagic) + " (an llm.c model file)");
  if (h[1] != kVersionF32 && h[1] != kVersionBF16)
    throw input_error("model file '" + path + "' has version " + std::to_string(h[1]) + ", expected 3 (fp32) or 5 (bf16)");
  const int want[] = {d.max_seq_len, d.vocab_size, d.n_layer, d.n_head, d.n_embd, d.padded_vocab};
  const char* names[] = {"max_seq_len", "vocab_size", "n_layer", "n_head", "n_embd", "padded_vocab_size"};
  for (int i = 0; i < 6; ++i)
    if (h[2 + i] != want[i])
      throw input_error("model file '" + path + "': " + names[i] + " is " + std::to_string(h[2 + i]) +
                        " but the config says " + std::to_string(want[i]));
  const bool bf16 = h[1] == kVersionBF16;
  size_t numel = 0;
  walk(ParamLayout(d), [&](size_t, size_t n, const TensorInfo&, int) { numel += n; });
  const uintmax_t size = std::filesystem::file_size(path, ec), want_size = sizeof h + numel * (bf16 ? 2 : 4);
  if (!ec && size != want_size)
    throw input_error("model file '" + path + "' " + (size < want_size ? "is truncated" : "is longer than its header says") +
                      ": " + std::to_string(size) + " bytes, its header's model takes " + std::to_string(want_size));
  return bf16;
}

// The file's next n values as fp32 into dst; an input error when the file ends first.
void read_values(const std::string& path, FILE* f, bool bf16, float* dst, size_t n, std::vector<uint16_t>& tmp) {
  size_t got;
  if (bf16) {
    tmp.resize(n);
    got = std::fread(tmp.data(), 2, n, f);
    for (size_t i = 0; i < got; ++i) dst[i] = bf16_to_f32(tmp[i]);
  } else {
    got = std::fread(dst, 4, n, f);
  }
  if (got != n) throw input_error("model file '" + path + "' is truncated");
}

// A NaN or an infinity in the weights would only show as a diverged first step: name the tensor.
// v holds the tensor's elements first..first+n.
void check_finite(const std::string& path, const TensorInfo& t, int layer, const float* v, size_t n, size_t first) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      throw input_error("model file '" + path + "': tensor " + t.name +
                        (layer >= 0 ? " of layer " + std::to_string(layer) : std::string()) + " holds " +
                        (std::isnan(v[i]) ? "NaN" : "an infinity") + " at element " + std::to_string(first + i) +
                        " of " + std::to_string(t.numel));
}

void check_file_ends(const std::string& path, FILE* f) {
  if (std::fgetc(f) != EOF) throw input_error("model file '" + path + "' is longer than its header says");
}

}  // namespace

void check_model_file(const std::string& path, const ModelDims& d) {
  if (is_hf_model_dir(path)) return check_hf_model(path, d);
  File f;
  const bool bf16 = open_model_file(path, d, f);
  std::vector<float> buf;
  std::vector<uint16_t> tmp;
  walk(ParamLayout(d), [&](size_t, size_t n, const TensorInfo& t, int layer) {
    for (size_t at = 0; at < n; at += buf.size()) {  // in pieces: the largest tensor need not fit twice
      buf.resize(std::min<size_t>(n - at, size_t(1) << 20));
      read_values(path, f.get(), bf16, buf.data(), buf.size(), tmp);
      check_finite(path, t, layer, buf.data(), buf.size(), at);
    }
  });
  check_file_ends(path, f.get());
}

std::vector<float> read_model_file(const std::string& path, const ParamLayout& L) {
  if (is_hf_model_dir(path)) return read_hf_model(path, L);
  File f;
  const bool bf16 = open_model_file(path, L.dims(), f);
  std::vector<float> out(L.total(), 0.0f);
  std::vector<uint16_t> tmp;
  walk(L, [&](size_t off, size_t n, const TensorInfo& t, int layer) {
    read_values(path, f.get(), bf16, out.data() + off, n, tmp);
    check_finite(path, t, layer, out.data() + off, n, 0);
  });
  check_file_ends(path, f.get());
  return out;
}

void write_model_file(const std::string& path, const ParamLayout& L, const std::vector<float>& logical, bool bf16) {
  const ModelDims& d = L.dims();  // (checked before any file exists: nothing half-written is left)
  if (!d.tied_head) throw input_error("llm.c model files hold GPT-2's tied head only (model.tied_head false)");
  const std::string tmp_path = path + ".tmp";
  std::unique_ptr<FILE, FileCloser> f(std::fopen(tmp_path.c_str(), "wb"));
  if (!f) throw input_error("cannot write '" + tmp_path + "'");
  int32_t h[256] = {0};
  h[0] = kModelMagic;
  h[1] = bf16 ? kVersionBF16 : kVersionF32;
  h[2] = d.max_seq_len;
  h[3] = d.vocab_size;
  h[4] = d.n_layer;
  h[5] = d.n_head;
  h[6] = d.n_embd;
  h[7] = d.padded_vocab;
  bool ok = std::fwrite(h, 4, 256, f.get()) == 256;
  std::vector<uint16_t> tmp;
  walk(L, [&](size_t off, size_t n, const TensorInfo&, int) {
    if (bf16) {
      tmp.resize(n);
      for (size_t i = 0; i < n; ++i) tmp[i] = f32_to_bf16(logical[off + i]);
      ok = ok && std::fwrite(tmp.data(), 2, n, f.get()) == n;
    } else {
      ok = ok && std::fwrite(logical.data() + off, 4, n, f.get()) == n;
    }
  });
  ok = ok && std::fflush(f.get()) == 0;
  f.reset();
  if (!ok || std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    std::remove(tmp_path.c_str());
    throw input_error("writing model file '" + path + "' failed (disk full?)");
  }
}

}  // namespace gpt
