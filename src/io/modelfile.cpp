#include "io/modelfile.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "base/common.hpp"
#include "io/hf.hpp"

namespace gpt {
namespace {

constexpr int32_t kModelMagic = 20240326;
constexpr int32_t kVersionF32 = 3, kVersionBF16 = 5;

// llm.c's tensor order; each tensor holds all layers in turn.
const P kFileOrder[] = {P::wte,  P::wpe,  P::ln1w, P::ln1b, P::qkvw,    P::qkvb,    P::attprojw, P::attprojb,
                        P::ln2w, P::ln2b, P::fcw,  P::fcb,  P::fcprojw, P::fcprojb, P::lnfw,     P::lnfb};

int bucket_of(const ParamLayout& L, P id, int layer) {
  if (id == P::wte || id == P::wpe) return 0;
  if (id == P::lnfw || id == P::lnfb) return L.final_bucket();
  return L.layer_bucket(layer);
}
bool per_layer(P id) { return !(id == P::wte || id == P::wpe || id == P::lnfw || id == P::lnfb); }

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};

// Calls fn(logical_offset, numel) for every tensor in file order.
template <class Fn>
void walk(const ParamLayout& L, Fn fn) {
  const int nl = L.dims().n_layer;
  for (P id : kFileOrder) {
    for (int l = 0; l < (per_layer(id) ? nl : 1); ++l) {
      const int b = bucket_of(L, id, l);
      const TensorInfo& t = L.bucket(b).tensor(id);
      fn(L.logical_offset(b) + t.offset, t.numel);
    }
  }
}

}  // namespace

std::vector<float> read_model_file(const std::string& path, const ParamLayout& L) {
  if (is_hf_model_dir(path)) return read_hf_model(path, L);
  if (std::filesystem::is_directory(path))
    throw input_error("model.init_from: '" + path + "' is a folder without config.json (expected an llm.c model "
                      "file or a Hugging Face GPT-2 folder with config.json and model.safetensors)");
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw input_error("model.init_from: cannot open '" + path + "'");
  int32_t h[256];
  if (std::fread(h, 4, 256, f.get()) != 256) throw input_error("model file '" + path + "' is truncated (no header)");
  if (h[0] != kModelMagic)
    throw input_error("model file '" + path + "' has magic " + std::to_string(h[0]) + ", expected " +
                      std::to_string(kModelMagic) + " (an llm.c model file)");
  if (h[1] != kVersionF32 && h[1] != kVersionBF16)
    throw input_error("model file '" + path + "' has version " + std::to_string(h[1]) + ", expected 3 (fp32) or 5 (bf16)");
  const ModelDims& d = L.dims();
  const int want[] = {d.max_seq_len, d.vocab_size, d.n_layer, d.n_head, d.n_embd, d.padded_vocab};
  const char* names[] = {"max_seq_len", "vocab_size", "n_layer", "n_head", "n_embd", "padded_vocab_size"};
  for (int i = 0; i < 6; ++i)
    if (h[2 + i] != want[i])
      throw input_error("model file '" + path + "': " + names[i] + " is " + std::to_string(h[2 + i]) +
                        " but the config says " + std::to_string(want[i]));
  const bool bf16 = h[1] == kVersionBF16;
  std::vector<float> out(L.total(), 0.0f);
  std::vector<uint16_t> tmp;
  walk(L, [&](size_t off, size_t n) {
    size_t got;
    if (bf16) {
      tmp.resize(n);
      got = std::fread(tmp.data(), 2, n, f.get());
      for (size_t i = 0; i < got; ++i) out[off + i] = bf16_to_f32(tmp[i]);
    } else {
      got = std::fread(out.data() + off, 4, n, f.get());
    }
    if (got != n) throw input_error("model file '" + path + "' is truncated");
  });
  if (std::fgetc(f.get()) != EOF) throw input_error("model file '" + path + "' is longer than its header says");
  return out;
}

void write_model_file(const std::string& path, const ParamLayout& L, const std::vector<float>& logical, bool bf16) {
  const std::string tmp_path = path + ".tmp";
  std::unique_ptr<FILE, FileCloser> f(std::fopen(tmp_path.c_str(), "wb"));
  if (!f) throw input_error("cannot write '" + tmp_path + "'");
  const ModelDims& d = L.dims();
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
  walk(L, [&](size_t off, size_t n) {
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
