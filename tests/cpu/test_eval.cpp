// Evaluation pieces: GPT-2's BPE against the ids the reference tokenizer gives, the multiple-choice file
// reader, the choice of ending, the sample prompt.
#include <cstdio>
#include <fstream>
#include <vector>

#include "test_util.hpp"
#include "io/bpe.hpp"
#include "io/evalfile.hpp"
#include "run/eval.hpp"
#include "run/hellaswag.hpp"

using namespace gpt;

namespace {
const std::string kVocab = gpt::tests::data_dir() + "/gpt2";
bool have_vocab() { return std::ifstream(kVocab + "/vocab.json").good(); }

void write_u16(std::ofstream& out, const std::vector<uint16_t>& w) {
  out.write(reinterpret_cast<const char*>(w.data()), std::streamsize(2 * w.size()));
}
// An eval file of the examples given as (label, context, endings).
void write_eval_file(const std::string& path, const std::vector<ChoiceExample>& ex, int32_t magic = 20240522) {
  std::ofstream out(path, std::ios::binary);
  int32_t h[256] = {magic, 1, int32_t(ex.size()), 0};
  out.write(reinterpret_cast<const char*>(h), sizeof h);
  for (size_t i = 0; i < ex.size(); ++i) {
    std::vector<uint16_t> w = {65535, 0, uint16_t(i), uint16_t(ex[i].label), uint16_t(ex[i].endings.size()),
                               uint16_t(ex[i].context.size())};
    w.insert(w.end(), ex[i].context.begin(), ex[i].context.end());
    for (auto& e : ex[i].endings) {
      w.push_back(uint16_t(e.size()));
      w.insert(w.end(), e.begin(), e.end());
    }
    w[1] = uint16_t(2 * w.size());
    write_u16(out, w);
  }
}
}  // namespace

TEST(Eval, bpe_encodes_as_gpt2_and_decodes_back) {
  if (!have_vocab()) GTEST_SKIP() << kVocab << "/vocab.json not found (TEST_DATA_DIR)";
  const Gpt2Vocab v(kVocab);
  EXPECT_TRUE(v.size() == 50257);
  // ids from the reference tokenizer (tokenizers' byte-level BPE over the same files)
  const std::vector<std::pair<std::string, std::vector<int>>> cases = {
      {"First Citizen:", {5962, 22307, 25}},
      {"Hello world", {15496, 995}},
      {"I'm here, they've 123 go!  \n\nNew   lines",
       {40, 1101, 994, 11, 484, 1053, 17031, 467, 0, 220, 220, 198, 198, 3791, 220, 220, 3951}},
      {"na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 \xE6\x9D\xB1\xE4\xBA\xAC \xE2\x98\x83 emoji \xF0\x9F\x99\x82",
       {2616, 38776, 40304, 851, 10545, 251, 109, 12859, 105, 34719, 225, 44805, 32485}},
      {"xxx", {31811}},
      {"<|endoftext|>Hello", {50256, 15496}},
      // contractions (case-sensitive), letters against digits, tabs, a no-break space, trailing spaces
      {"It's ''s we'll I'D abc123def\t\tx \xC2\xA0y  ",
       {1026, 338, 10148, 82, 356, 1183, 314, 6, 35, 450, 66, 10163, 4299, 197, 197, 87, 220, 1849, 88, 220, 220}},
      // a letter outside ASCII (U+00BA), Arabic-Indic digits, CJK punctuation, a fraction (a number)
      {"n\xC2\xBA \xD9\xA3\xD9\xA4 \xE3\x80\x82\xE6\x9D\xB1 \xC2\xBD!!?",
       {77, 36165, 18923, 96, 149, 97, 220, 16764, 30266, 109, 25208, 3228, 30}},
      {"   ", {220, 220, 220}},
  };
  for (auto& [text, ids] : cases) {
    EXPECT_TRUE(v.encode(text) == ids) << "encode '" + text + "'";
    EXPECT_TRUE(v.decode(ids) == text) << "decode '" + text + "'";
  }
  // two of the snowman's three bytes (after a space) and an unknown id become U+FFFD
  EXPECT_TRUE(v.decode({34719, 15496}) == " \xEF\xBF\xBDHello");
  EXPECT_TRUE(v.decode({15496, 60000}) == "Hello\xEF\xBF\xBD");
}

TEST(Eval, bpe_names_missing_and_malformed_files) {
  const std::string dir = "/tmp/gpt_bpe_test";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  EXPECT_THROW_WITH(Gpt2Vocab{dir}, "vocab.json");
  std::ofstream(dir + "/vocab.json") << "{\"a\": 0, \"b\": ";
  EXPECT_THROW_WITH(Gpt2Vocab{dir}, "not JSON");
  std::ofstream(dir + "/vocab.json") << "{\"a\": 0, \"b\": 1}";
  EXPECT_THROW_WITH(Gpt2Vocab{dir}, "merges.txt");
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\na b\nnonsense\n";
  EXPECT_THROW_WITH(Gpt2Vocab{dir}, "line 3");
  // the two files named themselves: a missing or malformed merges file is named with eval.merges
  EXPECT_THROW_WITH((Gpt2Vocab{dir + "/vocab.json", dir + "/bpe.txt"}),
                    "eval.merges: cannot read '" + dir + "/bpe.txt'");
  EXPECT_THROW_WITH((Gpt2Vocab{dir + "/vocab.json", dir + "/merges.txt"}),
                    "eval.merges: '" + dir + "/merges.txt' line 3");
  EXPECT_THROW_WITH((Gpt2Vocab{dir + "/v.json", dir + "/merges.txt"}), "eval.vocab: cannot read '" + dir + "/v.json'");
  std::system(("rm -rf " + dir).c_str());
}

TEST(Eval, bpe_reads_a_folder_or_the_two_files_alike) {
  if (!have_vocab()) GTEST_SKIP() << kVocab << "/vocab.json not found (TEST_DATA_DIR)";
  const Gpt2Vocab by_dir(kVocab), by_files(kVocab + "/vocab.json", kVocab + "/merges.txt");
  const std::string text = "First Citizen: Thou art, sirrah!";
  EXPECT_TRUE(by_files.size() == by_dir.size() && by_files.encode(text) == by_dir.encode(text));
  EXPECT_TRUE(by_files.decode(by_dir.encode(text)) == text);
  // the rule: a folder alone, or vocab.json with merges.txt; a file or folder in the other's place is named
  using Files = std::pair<std::string, std::string>;
  EXPECT_TRUE(gpt2_vocab_files(kVocab, "", "V", "M") == Files(kVocab + "/vocab.json", kVocab + "/merges.txt"));
  EXPECT_TRUE(gpt2_vocab_files(kVocab + "/vocab.json", kVocab + "/merges.txt", "V", "M") ==
              Files(kVocab + "/vocab.json", kVocab + "/merges.txt"));
  EXPECT_THROW_WITH(gpt2_vocab_files(kVocab + "/vocab.json", "", "V", "M"),
                    "V: '" + kVocab + "/vocab.json' is a file");
  EXPECT_THROW_WITH(gpt2_vocab_files(kVocab, kVocab + "/merges.txt", "V", "M"), "M: with it V names vocab.json itself");
  EXPECT_THROW_WITH(gpt2_vocab_files("", kVocab + "/merges.txt", "V", "M"), "M: '" + kVocab + "/merges.txt' needs V");
  EXPECT_THROW_WITH(gpt2_vocab_files(kVocab + "/vocab.json", kVocab, "V", "M"), "M: '" + kVocab + "' is a folder");
}

TEST(Eval, choice_file_reads_back_and_rejects_damage) {
  const std::string path = "/tmp/gpt_choice_test.bin";
  std::vector<ChoiceExample> ex(3);
  ex[0] = {2, {5, 6, 7}, {{1}, {2, 3}, {4, 4, 4}}};
  ex[1] = {0, {9}, {{8, 8}, {7}}};
  ex[2] = {1, {1, 2}, {{3}, {4}, {5}, {6}}};
  write_eval_file(path, ex);
  const auto got = read_choice_file(path, 64);
  EXPECT_TRUE(got.size() == 3);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(got[i].label == ex[i].label && got[i].context == ex[i].context && got[i].endings == ex[i].endings);
  EXPECT_THROW_WITH(read_choice_file(path, 8), "outside the model's vocabulary");
  write_eval_file(path, ex, 20240520);
  EXPECT_THROW_WITH(read_choice_file(path, 64), "magic");
  ex[1].label = 5;
  write_eval_file(path, ex);
  EXPECT_THROW_WITH(read_choice_file(path, 64), "example 1 has label 5");
  EXPECT_THROW_WITH(read_choice_file("/tmp/gpt_choice_none.bin", 64), "gpt_choice_none.bin");
  std::remove(path.c_str());
}

TEST(Eval, pick_ending_by_sum_and_by_mean) {
  // ending 0: 2 tokens, sum 3 (mean 1.5); ending 1: 6 tokens, sum 4.8 (mean 0.8); ending 2: 1 token, 3.2
  const ChoicePick p = pick_ending({3.0, 4.8, 3.2}, {2, 6, 1});
  EXPECT_TRUE(p.by_sum == 0 && p.by_mean == 1);
  const ChoicePick tie = pick_ending({1.0, 1.0}, {1, 1});
  EXPECT_TRUE(tie.by_sum == 0 && tie.by_mean == 0);  // the first of equal ones
}

TEST(Eval, sample_prompt_is_ids_or_text) {
  EXPECT_TRUE(sample_prompt_ids("", nullptr, 64) == std::vector<int>{63});
  EXPECT_TRUE((sample_prompt_ids("1, 2,3 4", nullptr, 64) == std::vector<int>{1, 2, 3, 4}));
  EXPECT_THROW_WITH(sample_prompt_ids("64", nullptr, 64), "outside the vocabulary");
  EXPECT_THROW_WITH(sample_prompt_ids("ROMEO:", nullptr, 64), "eval.vocab");
  if (!have_vocab()) return;
  const Gpt2Vocab v(kVocab);
  EXPECT_TRUE((sample_prompt_ids("First Citizen:", &v, 50257) == std::vector<int>{5962, 22307, 25}));
  EXPECT_THROW_WITH(sample_prompt_ids("First Citizen:", &v, 1000), "outside the model's vocabulary");
}

