// GPT-2's byte-level BPE vocabulary, from the vocab.json and merges.txt that GPT-2 ships: token ids to
// text (decoding needs only vocab.json) and text to token ids (the merges, over GPT-2's split pattern).
#pragma once
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpt {

class Gpt2Vocab {
 public:
  // Reads dir/vocab.json and dir/merges.txt; an input error names the file that is missing or malformed
  // (and eval.vocab, the key that names the folder).
  explicit Gpt2Vocab(const std::string& dir);
  // Reads the two files themselves (eval.vocab naming vocab.json, eval.merges merges.txt); the same errors.
  Gpt2Vocab(const std::string& vocab_json, const std::string& merges_txt);
  int size() const { return int(bytes_.size()); }
  // The text of ids as valid UTF-8: byte sequences the tokens leave incomplete (a sample cut inside a
  // character) and ids outside the vocabulary become U+FFFD.
  std::string decode(const std::vector<int>& ids) const;
  // The ids of UTF-8 text, as GPT-2's tokenizer gives them; "<|endoftext|>" is its one token.
  std::vector<int> encode(const std::string& text) const;

 private:
  Gpt2Vocab(const std::string& vocab_json, const std::string& merges_txt, const std::string& merges_key);
  void encode_word(const std::string& word, std::vector<int>& out) const;
  std::vector<std::string> bytes_;                   // id -> the bytes it stands for
  std::unordered_map<std::string, int> ids_;         // vocab.json key (bytes mapped to code points) -> id
  std::map<std::pair<std::string, std::string>, int> ranks_;  // merge -> its line: lower merges first
};

// The one way a GPT-2 vocabulary is named (the config's eval.vocab and eval.merges, export's --vocab and
// --merges, the scripts' flags): `merges` empty = `vocab` is a folder holding vocab.json and merges.txt;
// else `vocab` is the vocab.json file and `merges` the merges.txt file. Returns the two paths; an input
// error names the key when a file is given where the rule wants a folder or the other way round (a path
// that does not exist passes: reading it names it).
std::pair<std::string, std::string> gpt2_vocab_files(const std::string& vocab, const std::string& merges,
                                                     const std::string& vocab_key, const std::string& merges_key);

}  // namespace gpt
