#include "io/bpe.hpp"

#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <climits>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/common.hpp"

namespace gpt {

namespace {

// GPT-2 writes every byte as one printable code point: the printable Latin-1 bytes as themselves, the
// other 68 as 256, 257, ... in byte order, so that no token's text holds a space or a control character.
struct ByteTable {
  UChar32 cp[256];
  int byte_of[256 + 68];  // code point -> byte
  std::string text[256];  // a byte's code point as UTF-8: the symbols BPE starts from
  ByteTable() {
    for (int& b : byte_of) b = -1;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cp[b] = printable ? b : 256 + extra++;
      byte_of[cp[b]] = b;
      icu::UnicodeString(cp[b]).toUTF8String(text[b]);
    }
  }
};
const ByteTable& bytes_table() {
  static const ByteTable t;  // immutable after construction
  return t;
}

// GPT-2's split of text into words before the merges: contractions, letters, digits, other symbols,
// each with one optional leading space; runs of spaces.
const char* kSplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kEndOfText = "<|endoftext|>";
const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::string utf8_valid(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toUTF8String(out);  // ill-formed sequences become U+FFFD
  return out;
}

}  // namespace

Gpt2Vocab::Gpt2Vocab(const std::string& dir) {
  const ByteTable& bt = bytes_table();
  const std::string vocab_path = dir + "/vocab.json", merges_path = dir + "/merges.txt";
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
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(key);
    std::string b;
    for (int32_t i = 0; i < u.length(); i = u.moveIndex32(i, 1)) {
      const UChar32 c = u.char32At(i);
      if (c < 0 || c >= 256 + 68 || bt.byte_of[c] < 0)
        throw input_error("eval.vocab: '" + vocab_path + "': token '" + key +
                          "' is not in GPT-2's byte-level form (not a GPT-2 vocab.json?)");
      b += char(bt.byte_of[c]);
    }
    if (bytes_.size() <= size_t(id)) bytes_.resize(size_t(id) + 1);
    bytes_[size_t(id)] = b;
    ids_[key] = id;
  }
  std::ifstream mf(merges_path);
  if (!mf) throw input_error("eval.vocab: cannot read '" + merges_path + "' (GPT-2's merges.txt)");
  std::string line;
  int rank = 0, lineno = 0;
  while (std::getline(mf, line)) {
    ++lineno;
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size())
      throw input_error("eval.vocab: '" + merges_path + "' line " + std::to_string(lineno) +
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
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexPattern> pattern(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kSplitPattern), 0, status));
  if (U_FAILURE(status)) throw Error(kExitFailure, std::string("ICU cannot compile GPT-2's split pattern: ") + u_errorName(status));
  std::vector<int> out;
  const auto eot = ids_.find(kEndOfText);
  size_t from = 0;
  while (from <= text.size()) {
    size_t at = text.find(kEndOfText, from);
    if (eot == ids_.end()) at = std::string::npos;
    const icu::UnicodeString part = icu::UnicodeString::fromUTF8(text.substr(from, at == std::string::npos ? at : at - from));
    std::unique_ptr<icu::RegexMatcher> m(pattern->matcher(part, status));
    while (U_SUCCESS(status) && m->find()) {
      std::string word;
      part.tempSubStringBetween(m->start(status), m->end(status)).toUTF8String(word);
      encode_word(word, out);
    }
    if (U_FAILURE(status)) throw Error(kExitFailure, std::string("ICU regex: ") + u_errorName(status));
    if (at == std::string::npos) break;
    out.push_back(eot->second);
    from = at + std::string(kEndOfText).size();
  }
  return out;
}

}  // namespace gpt
