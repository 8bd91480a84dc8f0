// Multiple-choice evaluation sets (HellaSwag) in llm.c's eval file format, which
// scripts/prepare_hellaswag.py writes: int32[256] little-endian header ([0] = 20240522, [1] = 1,
// [2] = examples, [3] = the longest example in bytes), then per example a run of uint16: 65535, the
// example's size in bytes (this run included), its index, the label, the number of endings, the context's
// length and tokens, then each ending's length and tokens.
#pragma once
#include <string>
#include <vector>

namespace gpt {

struct ChoiceExample {
  int label = 0;                            // index of the right ending
  std::vector<int> context;                 // tokens
  std::vector<std::vector<int>> endings;    // tokens of each candidate ending
};

// Reads and checks the whole file; an input error names the file, the example and what is wrong
// (also a token id outside [0, vocab_size), a folder, a file of no examples).
std::vector<ChoiceExample> read_choice_file(const std::string& path, int vocab_size);

}  // namespace gpt
