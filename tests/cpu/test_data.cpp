// Token shards and the synthetic corpus.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <vector>

#include "test_util.hpp"
#include "config/config.hpp"
#include "io/data.hpp"

using namespace gpt;

namespace {
const std::string kShared = gpt::tests::data_dir() + "/tinyshakespeare/";
bool have_shared() { return std::ifstream(kShared + "tiny_shakespeare_val.bin").good(); }

std::vector<char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void spit(const std::string& p, const std::vector<char>& v) {
  std::ofstream out(p, std::ios::binary);
  out.write(v.data(), std::streamsize(v.size()));
}
}  // namespace

TEST(Data, reads_tinyshakespeare_val_shard) {
  if (!have_shared()) GTEST_SKIP() << kShared << "tiny_shakespeare_val.bin not found (TEST_DATA_DIR)";
  auto info = read_shard_header(kShared + "tiny_shakespeare_val.bin");
  EXPECT_TRUE(info.n_tokens == 32768);
  auto src = make_shard_source(kShared + "tiny_shakespeare_val.bin", 2, 8, 0, 1, 50257);
  std::vector<int> tok(16), tgt(16);
  src->next(tok.data(), tgt.data());
  EXPECT_TRUE(tok[0] == 50256 && tok[1] == 5962 && tok[2] == 22307 && tok[3] == 25);
  EXPECT_TRUE(tgt[0] == 5962 && tgt[2] == 25);
  EXPECT_TRUE(tgt[7] == tok[8]);  // rows are consecutive text
}

TEST(Data, ranks_read_their_rows_of_the_global_batch) {
  if (!have_shared()) GTEST_SKIP() << kShared << "tiny_shakespeare_val.bin not found (TEST_DATA_DIR)";
  const std::string val = kShared + "tiny_shakespeare_val.bin";
  auto one = make_shard_source(val, 4, 8, 0, 1, 50257);
  auto r0 = make_shard_source(val, 2, 8, 0, 2, 50257);
  auto r1 = make_shard_source(val, 2, 8, 1, 2, 50257);
  std::vector<int> a(32), at(32), b(16), bt(16), c(16), ct(16);
  for (int step = 0; step < 3; ++step) {
    one->next(a.data(), at.data());
    r0->next(b.data(), bt.data());
    r1->next(c.data(), ct.data());
    EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()));
    EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin() + 16));
    EXPECT_TRUE(std::equal(ct.begin(), ct.end(), at.begin() + 16));
  }
}

TEST(Data, rejects_truncated_and_wrong_magic_shards) {
  if (!have_shared()) GTEST_SKIP() << kShared << "tiny_shakespeare_val.bin not found (TEST_DATA_DIR)";
  auto bytes = slurp(kShared + "tiny_shakespeare_val.bin");
  const std::string dir = "/tmp/gpt_data_test";
  std::system(("mkdir -p " + dir).c_str());
  auto trunc = bytes;
  trunc.resize(bytes.size() - 100);
  spit(dir + "/trunc.bin", trunc);
  EXPECT_THROW_WITH(read_shard_header(dir + "/trunc.bin"), "truncated");
  EXPECT_THROW_WITH(make_shard_source(dir + "/trunc.bin", 1, 8, 0, 1, 50257), "trunc.bin");
  auto magic = bytes;
  magic[0] ^= 0x5a;
  spit(dir + "/magic.bin", magic);
  EXPECT_THROW_WITH(read_shard_header(dir + "/magic.bin"), "magic");
  spit(dir + "/short.bin", std::vector<char>(bytes.begin(), bytes.begin() + 100));
  EXPECT_THROW_WITH(read_shard_header(dir + "/short.bin"), "header");
  EXPECT_THROW_WITH(make_shard_source(dir + "/none_*.bin", 1, 8, 0, 1, 50257), "no data files match");
  std::system(("rm -rf " + dir).c_str());
}

TEST(Data, synthetic_corpus_follows_its_chain) {
  DataConfig dc;
  dc.synthetic = true;
  dc.synthetic_vocab = 50;
  dc.synthetic_branching = 3;
  auto src = make_synthetic_source(dc, 42, 0, 4, 32, 0, 1);
  std::vector<int> tok(128), tgt(128);
  std::vector<std::set<int>> succ(50);
  for (int i = 0; i < 200; ++i) {
    src->next(tok.data(), tgt.data());
    for (int j = 0; j < 128; ++j) {
      EXPECT_TRUE(tok[j] >= 0 && tok[j] < 50);
      succ[tok[j]].insert(tgt[j]);
    }
  }
  for (auto& s : succ) EXPECT_TRUE(s.size() == 3);  // exactly `branching` successors were seen
  EXPECT_NEAR(synthetic_loss_floor(dc), std::log(3.0), 1e-12);
  // the val stream uses the same chain but other sequences
  auto val = make_synthetic_source(dc, 42, 1, 4, 32, 0, 1);
  std::vector<int> vt(128), vg(128);
  val->next(vt.data(), vg.data());
  bool differs = false;
  for (int j = 0; j < 128; ++j) {
    EXPECT_TRUE(succ[vt[j]].count(vg[j]) == 1);
    differs |= vt[j] != tok[j];
  }
  EXPECT_TRUE(differs);
  // positions restore exactly
  auto pos = src->position();
  src->next(tok.data(), tgt.data());
  auto again = make_synthetic_source(dc, 42, 0, 4, 32, 0, 1);
  again->seek(pos);
  again->next(vt.data(), vg.data());
  EXPECT_TRUE(vt == tok);
}

// Shards whose sequences (of kT tokens) name themselves: sequence i of shard s starts with token
// 1000 * s + i, so a batch row says which sequence it is.
constexpr int kT = 8;
const std::string kShardDir = "/tmp/gpt_shuffle_test";
std::string write_numbered_shards(const std::vector<int>& n_seq) {
  std::system(("rm -rf " + kShardDir + " && mkdir -p " + kShardDir).c_str());
  for (size_t s = 0; s < n_seq.size(); ++s) {
    std::vector<uint16_t> tok(size_t(n_seq[s]) * kT + 1 + 3);  // 3 tokens of tail that make no sequence
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = uint16_t(i % kT == 0 ? 1000 * s + i / kT : 7);
    int32_t h[256] = {20240520, 1, int32_t(tok.size())};
    std::ofstream out(kShardDir + "/s_" + std::to_string(s) + ".bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(h), sizeof h);
    out.write(reinterpret_cast<const char*>(tok.data()), std::streamsize(2 * tok.size()));
  }
  return kShardDir + "/s_*.bin";
}
// The sequence names of the next `batches` global micro-batches, read by `world` ranks of B rows.
std::vector<int> read_names(std::vector<std::unique_ptr<TokenSource>>& ranks, int B, int batches) {
  std::vector<int> names, tok(size_t(B) * kT), tgt(size_t(B) * kT);
  for (int i = 0; i < batches; ++i)
    for (auto& r : ranks) {
      r->next(tok.data(), tgt.data());
      for (int b = 0; b < B; ++b) names.push_back(tok[size_t(b) * kT]);
    }
  return names;
}
std::vector<std::unique_ptr<TokenSource>> sources(const std::string& glob, int B, int world, ShardOrder o) {
  std::vector<std::unique_ptr<TokenSource>> v;
  for (int r = 0; r < world; ++r) v.push_back(make_shard_source(glob, B, kT, r, world, 65535, o));
  return v;
}

TEST(Data, shuffle_is_seeded_and_each_epoch_reads_every_sequence_once) {
  const std::vector<int> n_seq = {12, 20, 8};  // multiples of the 4 rows of a global micro-batch
  const std::string glob = write_numbered_shards(n_seq);
  const int per_epoch = 40 / 4;
  auto a = sources(glob, 4, 1, {true, 11});
  EXPECT_TRUE(a[0]->epoch_batches() == per_epoch);
  const std::vector<int> e1 = read_names(a, 4, per_epoch), e2 = read_names(a, 4, per_epoch);
  EXPECT_TRUE(a[0]->position().epoch == 1);
  std::set<int> all;
  for (size_t s = 0; s < n_seq.size(); ++s)
    for (int i = 0; i < n_seq[s]; ++i) all.insert(int(1000 * s + i));
  for (const auto* e : {&e1, &e2}) {
    EXPECT_TRUE(std::set<int>(e->begin(), e->end()) == all);  // each sequence, and (40 names) each once
    EXPECT_TRUE(e->size() == all.size());
    // a global micro-batch never mixes shards
    for (size_t b = 0; b < e->size(); b += 4) EXPECT_TRUE((*e)[b] / 1000 == (*e)[b + 3] / 1000);
  }
  EXPECT_TRUE(e1 != e2);  // a new order each epoch
  std::vector<int> file_order(all.begin(), all.end());
  EXPECT_TRUE(e1 != file_order);
  auto again = sources(glob, 4, 1, {true, 11});
  std::vector<int> both = e1;
  both.insert(both.end(), e2.begin(), e2.end());
  EXPECT_TRUE(read_names(again, 4, 2 * per_epoch) == both);
  auto other = sources(glob, 4, 1, {true, 12});
  EXPECT_TRUE(read_names(other, 4, per_epoch) != e1);
  // data.shuffle: false is the file order, shard after shard
  auto plain = sources(glob, 4, 1, {false, 11});
  EXPECT_TRUE(read_names(plain, 4, per_epoch) == file_order);
}

TEST(Data, shuffle_skips_a_different_tail_each_epoch) {
  const std::string glob = write_numbered_shards({10});  // 2 rows left over after 2 batches of 4
  auto a = sources(glob, 4, 1, {true, 3});
  EXPECT_TRUE(a[0]->epoch_batches() == 2);
  std::set<int> seen_over_epochs;
  for (int e = 0; e < 8; ++e) {
    const std::vector<int> names = read_names(a, 4, 2);
    EXPECT_TRUE(std::set<int>(names.begin(), names.end()).size() == 8);  // none twice in an epoch
    seen_over_epochs.insert(names.begin(), names.end());
  }
  EXPECT_TRUE(seen_over_epochs.size() == 10);  // the skipped two differ between epochs
}

TEST(Data, two_ranks_read_what_one_rank_with_twice_the_rows_reads) {
  const std::string glob = write_numbered_shards({12, 20, 9});
  auto one = sources(glob, 6, 1, {true, 5});
  auto two = sources(glob, 3, 2, {true, 5});
  EXPECT_TRUE(read_names(one, 6, 14) == read_names(two, 3, 14));  // two epochs and more
  auto three = sources(glob, 2, 3, {true, 5});
  auto one_again = sources(glob, 6, 1, {true, 5});
  EXPECT_TRUE(read_names(one_again, 6, 9) == read_names(three, 2, 9));
}

TEST(Data, a_shuffled_position_resumes_exactly) {
  const std::string glob = write_numbered_shards({12, 20, 8});
  for (int stop : {1, 3, 4, 9, 10, 13}) {  // inside a shard, at a shard's end, at the epoch's end, after it
    auto a = sources(glob, 4, 1, {true, 9});
    read_names(a, 4, stop);
    const DataPosition p = a[0]->position();
    EXPECT_TRUE(p.shuffled);
    const std::vector<int> rest = read_names(a, 4, 12);
    auto b = sources(glob, 4, 1, {true, 9});
    b[0]->seek(p);
    EXPECT_TRUE(read_names(b, 4, 12) == rest) << "resumed after " + std::to_string(stop) + " batches";
  }
  auto plain = sources(glob, 4, 1, {false, 9});
  DataPosition p;
  p.shuffled = true;
  EXPECT_THROW_WITH(plain[0]->seek(p), "data.shuffle");
  std::system(("rm -rf " + kShardDir).c_str());
}

