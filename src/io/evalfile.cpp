#include "io/evalfile.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/common.hpp"
#include "base/input_file.hpp"

namespace gpt {

namespace {
constexpr int32_t kEvalMagic = 20240522;
constexpr int32_t kEvalVersion = 1;
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);
constexpr uint16_t kExampleStart = 65535;
}  // namespace

std::vector<ChoiceExample> read_choice_file(const std::string& path, int vocab_size) {
  check_input_file(path, "eval.hellaswag");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))  // an ifstream opens a folder, then fails inside its first read
    throw input_error("eval.hellaswag: '" + path + "' is a folder; give the token file scripts/prepare_hellaswag.py "
                      "writes");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("eval.hellaswag: cannot open '" + path + "'");
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return input_error("eval.hellaswag: '" + path + "' " + why); };
  if (raw.size() < kHeaderBytes) throw bad("is shorter than its 1024-byte header (not an eval file?)");
  int32_t h[256];
  std::memcpy(h, raw.data(), kHeaderBytes);
  if (h[0] != kEvalMagic)
    throw bad("has magic number " + std::to_string(h[0]) + ", expected " + std::to_string(kEvalMagic) +
              " (make it with scripts/prepare_hellaswag.py)");
  if (h[1] != kEvalVersion) throw bad("has version " + std::to_string(h[1]) + ", expected 1");
  if (h[2] < 1) throw bad("holds " + std::to_string(h[2]) + " examples (its header says so): nothing to evaluate");
  if ((raw.size() - kHeaderBytes) % 2 != 0) throw bad("has an odd number of bytes after its header (truncated?)");
  std::vector<uint16_t> w((raw.size() - kHeaderBytes) / 2);
  std::memcpy(w.data(), raw.data() + kHeaderBytes, w.size() * 2);
  std::vector<ChoiceExample> out;
  size_t at = 0;
  for (int32_t i = 0; i < h[2]; ++i) {
    const std::string which = "example " + std::to_string(i);
    if (at + 6 > w.size()) throw bad("ends inside " + which + " (truncated? the header says " + std::to_string(h[2]) + " examples)");
    if (w[at] != kExampleStart) throw bad(which + " does not start with the example marker 65535");
    const size_t end = at + w[at + 1] / 2;
    auto field = [&]() {
      if (at + 1 > end || end > w.size()) throw bad(which + " is longer than its size field says (corrupt?)");
      return size_t(w[at++]);
    };
    auto take = [&](size_t n) {
      if (at + n > end || end > w.size()) throw bad(which + " is longer than its size field says (corrupt?)");
      std::vector<int> v(w.begin() + long(at), w.begin() + long(at + n));
      for (int t : v)
        if (t >= vocab_size)
          throw bad(which + " has token id " + std::to_string(t) + ", outside the model's vocabulary (" +
                    std::to_string(vocab_size) + ")");
      at += n;
      return v;
    };
    ChoiceExample ex;
    ex.label = w[at + 3];
    const int n_endings = w[at + 4];
    at += 5;
    ex.context = take(field());
    for (int k = 0; k < n_endings; ++k) ex.endings.push_back(take(field()));
    if (at != end) throw bad(which + " is shorter than its size field says (corrupt?)");
    if (n_endings < 1 || ex.label >= n_endings)
      throw bad(which + " has label " + std::to_string(ex.label) + " but " + std::to_string(n_endings) + " endings");
    if (ex.context.empty()) throw bad(which + " has an empty context");
    for (auto& e : ex.endings)
      if (e.empty()) throw bad(which + " has an empty ending");
    out.push_back(std::move(ex));
  }
  if (at != w.size()) throw bad("has data after its " + std::to_string(h[2]) + " examples (corrupt?)");
  return out;
}

}  // namespace gpt
