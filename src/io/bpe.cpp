#include "io/bpe.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/common.hpp"
#include "base/input_file.hpp"

namespace gpt {

namespace {

struct CodeRange {
  uint32_t lo, hi;
};
#include "io/unicode_classes.inc"

template <size_t N>
bool in_ranges(const CodeRange (&t)[N], uint32_t cp) {
  const CodeRange* r = std::upper_bound(t, t + N, cp, [](uint32_t c, const CodeRange& x) { return c < x.lo; });
  return r != t && cp <= (r - 1)->hi;
}
bool is_letter(uint32_t cp) { return in_ranges(kLetters, cp); }
bool is_number(uint32_t cp) { return in_ranges(kNumbers, cp); }
// Unicode's White_Space, what \s matches in the tokenizers GPT-2 is encoded with
bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

constexpr uint32_t kInvalid = 0xFFFD;
// The code point at s[i], advancing i; an ill-formed sequence gives kInvalid and is skipped as far as
// it went right (its maximal valid prefix, at least one byte), as Unicode recommends.
uint32_t next_code_point(const std::string& s, size_t& i) {
  const unsigned char c = s[i++];
  if (c < 0x80) return c;
  const int n = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : -1;
  if (n < 0 || c > 0xF4) return kInvalid;
  uint32_t cp = c & (0x3F >> n);
  for (int k = 0; k < n; ++k) {
    if (i >= s.size()) return kInvalid;
    const unsigned char d = s[i];
    // the second byte's range excludes overlong forms, surrogates and code points past U+10FFFF
    const unsigned char lo = k == 0 && c == 0xE0 ? 0xA0 : k == 0 && c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = k == 0 && c == 0xED ? 0x9F : k == 0 && c == 0xF4 ? 0x8F : 0xBF;
    if (d < lo || d > hi) return kInvalid;
    cp = (cp << 6) | (d & 0x3F);
    ++i;
  }
  return cp;
}
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// GPT-2's split of text into words before the merges, the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// scanned by hand: at each place the first alternative that matches, as far as it matches.
std::vector<std::string> split_words(const std::string& text) {
  std::vector<uint32_t> cp;
  std::vector<size_t> at;  // byte offset of each code point, and the end
  for (size_t i = 0; i < text.size();) {
    at.push_back(i);
    cp.push_back(next_code_point(text, i));
  }
  at.push_back(text.size());
  const size_t n = cp.size();
  auto kind = [&](size_t k) { return is_letter(cp[k]) ? 1 : is_number(cp[k]) ? 2 : is_space(cp[k]) ? 0 : 3; };
  std::vector<std::string> words;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    for (const char* c : {"s", "t", "re", "ve", "m", "ll", "d"}) {
      const std::string tail = std::string("'") + c;
      if (text.compare(at[i], tail.size(), tail) == 0) {
        j = i + tail.size();
        break;
      }
    }
    if (j == i) {
      const size_t k = cp[i] == ' ' && i + 1 < n && kind(i + 1) != 0 ? i + 1 : i;  // the optional space
      const int c = kind(k);
      if (c != 0) {
        for (j = k + 1; j < n && kind(j) == c;) ++j;
      } else {
        for (j = i + 1; j < n && kind(j) == 0;) ++j;
        if (j < n && j - i > 1) --j;  // leave the last space to the word after it
      }
    }
    words.push_back(text.substr(at[i], at[j] - at[i]));
    i = j;
  }
  return words;
}

// GPT-2 writes every byte as one printable code point: the printable Latin-1 bytes as themselves, the
// other 68 as 256, 257, ... in byte order, so that no token's text holds a space or a control character.
struct ByteTable {
  int cp[256];
  int byte_of[256 + 68];  // code point -> byte
  std::string text[256];  // a byte's code point as UTF-8: the symbols BPE starts from
  ByteTable() {
    for (int& b : byte_of) b = -1;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cp[b] = printable ? b : 256 + extra++;
      byte_of[cp[b]] = b;
      append_utf8(text[b], uint32_t(cp[b]));
    }
  }
};
const ByteTable& bytes_table() {
  static const ByteTable t;  // immutable after construction
  return t;
}

const char* kEndOfText = "<|endoftext|>";
const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::string utf8_valid(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) append_utf8(out, next_code_point(s, i));
  return out;
}

}  // namespace

Gpt2Vocab::Gpt2Vocab(const std::string& dir) : Gpt2Vocab(dir + "/vocab.json", dir + "/merges.txt", "eval.vocab") {}

Gpt2Vocab::Gpt2Vocab(const std::string& vocab_json, const std::string& merges_txt)
    : Gpt2Vocab(vocab_json, merges_txt, "eval.merges") {}

Gpt2Vocab::Gpt2Vocab(const std::string& vocab_path, const std::string& merges_path, const std::string& merges_key) {
  const ByteTable& bt = bytes_table();
  check_input_file(vocab_path, "eval.vocab");
  check_input_file(merges_path, merges_key);
  std::ifstream vf(vocab_path);
  if (!vf) throw input_error("eval.vocab: cannot read '" + vocab_path + "' (GPT-2's vocab.json)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vf);
  } catch (const nlohmann::json::exception& e) {
    throw input_error("eval.vocab: '" + vocab_path + "' is not JSON: " + e.what());
  }
  if (!j.is_object() || j.empty())
    throw input_error("eval.vocab: '" + vocab_path + "' is not a mapping of token strings to ids");
  for (auto& [key, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= int64_t(j.size()))
      throw input_error("eval.vocab: '" + vocab_path + "': token '" + key + "' has no id in [0, " +
                        std::to_string(j.size()) + ")");
    const int id = value.get<int>();
    std::string b;
    for (size_t i = 0; i < key.size();) {
      const uint32_t c = next_code_point(key, i);
      if (c >= 256 + 68 || bt.byte_of[c] < 0)
        throw input_error("eval.vocab: '" + vocab_path + "': token '" + key +
                          "' is not in GPT-2's byte-level form (not a GPT-2 vocab.json?)");
      b += char(bt.byte_of[c]);
    }
    if (bytes_.size() <= size_t(id)) bytes_.resize(size_t(id) + 1);
    bytes_[size_t(id)] = b;
    ids_[key] = id;
  }
  std::ifstream mf(merges_path);
  if (!mf) throw input_error(merges_key + ": cannot read '" + merges_path + "' (GPT-2's merges.txt)");
  std::string line;
  int rank = 0, lineno = 0;
  while (std::getline(mf, line)) {
    ++lineno;
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size())
      throw input_error(merges_key + ": '" + merges_path + "' line " + std::to_string(lineno) +
                        " is not a merge 'A B'");
    ranks_[{line.substr(0, sp), line.substr(sp + 1)}] = rank++;
  }
}

std::string Gpt2Vocab::decode(const std::vector<int>& ids) const {
  std::string s;
  for (int id : ids) s += id >= 0 && id < size() ? bytes_[size_t(id)] : kReplacement;
  return utf8_valid(s);
}

void Gpt2Vocab::encode_word(const std::string& word, std::vector<int>& out) const {
  const ByteTable& bt = bytes_table();
  std::vector<std::string> sym;
  for (unsigned char b : word) sym.push_back(bt.text[b]);
  while (sym.size() > 1) {
    // the adjacent pair merged earliest in training, then every occurrence of it, left to right
    int best = INT_MAX;
    std::pair<std::string, std::string> pair;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ranks_.find({sym[i], sym[i + 1]});
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        pair = it->first;
      }
    }
    if (best == INT_MAX) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < sym.size(); ++i) {
      if (i + 1 < sym.size() && sym[i] == pair.first && sym[i + 1] == pair.second) {
        merged.push_back(sym[i] + sym[i + 1]);
        ++i;
      } else {
        merged.push_back(sym[i]);
      }
    }
    sym.swap(merged);
  }
  for (auto& s : sym) {
    auto it = ids_.find(s);
    if (it == ids_.end()) throw input_error("eval.vocab: the vocabulary has no token for '" + s + "'");
    out.push_back(it->second);
  }
}

std::vector<int> Gpt2Vocab::encode(const std::string& text) const {
  std::vector<int> out;
  const auto eot = ids_.find(kEndOfText);
  size_t from = 0;
  while (from <= text.size()) {
    const size_t at = eot == ids_.end() ? std::string::npos : text.find(kEndOfText, from);
    for (const std::string& w : split_words(text.substr(from, at == std::string::npos ? at : at - from)))
      encode_word(w, out);
    if (at == std::string::npos) break;
    out.push_back(eot->second);
    from = at + std::string(kEndOfText).size();
  }
  return out;
}

std::pair<std::string, std::string> gpt2_vocab_files(const std::string& vocab, const std::string& merges,
                                                     const std::string& vocab_key, const std::string& merges_key) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (merges.empty()) {
    if (vocab.empty()) throw input_error(vocab_key + ": empty (a folder holding GPT-2's vocab.json and merges.txt)");
    if (fs::exists(vocab, ec) && !fs::is_directory(vocab, ec))
      throw input_error(vocab_key + ": '" + vocab + "' is a file, not a folder: give GPT-2's merges.txt with " +
                        merges_key + " (then " + vocab_key + " is vocab.json itself), or a folder holding vocab.json "
                        "and merges.txt");
    return {vocab + "/vocab.json", vocab + "/merges.txt"};
  }
  if (vocab.empty())
    throw input_error(merges_key + ": '" + merges + "' needs " + vocab_key + " to name GPT-2's vocab.json beside it");
  if (fs::is_directory(vocab, ec))
    throw input_error(merges_key + ": with it " + vocab_key + " names vocab.json itself, but '" + vocab +
                      "' is a folder (give the folder alone, or its vocab.json)");
  if (fs::is_directory(merges, ec))
    throw input_error(merges_key + ": '" + merges + "' is a folder, not GPT-2's merges.txt");
  return {vocab, merges};
}

}  // namespace gpt
