// Token shards and the synthetic corpus.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <vector>

#include "check.hpp"
#include "config/config.hpp"
#include "io/data.hpp"

using namespace gpt;

namespace {
const std::string kShared = "../shared/data/tinyshakespeare/";
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

TEST(reads_tinyshakespeare_val_shard) {
  if (!have_shared()) {
    std::printf("  SKIP: %s not found\n", kShared.c_str());
    return;
  }
  auto info = read_shard_header(kShared + "tiny_shakespeare_val.bin");
  CHECK(info.n_tokens == 32768);
  auto src = make_shard_source(kShared + "tiny_shakespeare_val.bin", 2, 8, 0, 1, 50257);
  std::vector<int> tok(16), tgt(16);
  src->next(tok.data(), tgt.data());
  CHECK(tok[0] == 50256 && tok[1] == 5962 && tok[2] == 22307 && tok[3] == 25);
  CHECK(tgt[0] == 5962 && tgt[2] == 25);
  CHECK(tgt[7] == tok[8]);  // rows are consecutive text
}

TEST(ranks_read_their_rows_of_the_global_batch) {
  if (!have_shared()) {
    std::printf("  SKIP: shared data not found\n");
    return;
  }
  const std::string val = kShared + "tiny_shakespeare_val.bin";
  auto one = make_shard_source(val, 4, 8, 0, 1, 50257);
  auto r0 = make_shard_source(val, 2, 8, 0, 2, 50257);
  auto r1 = make_shard_source(val, 2, 8, 1, 2, 50257);
  std::vector<int> a(32), at(32), b(16), bt(16), c(16), ct(16);
  for (int step = 0; step < 3; ++step) {
    one->next(a.data(), at.data());
    r0->next(b.data(), bt.data());
    r1->next(c.data(), ct.data());
    CHECK(std::equal(b.begin(), b.end(), a.begin()));
    CHECK(std::equal(c.begin(), c.end(), a.begin() + 16));
    CHECK(std::equal(ct.begin(), ct.end(), at.begin() + 16));
  }
}

TEST(rejects_truncated_and_wrong_magic_shards) {
  if (!have_shared()) {
    std::printf("  SKIP: shared data not found\n");
    return;
  }
  auto bytes = slurp(kShared + "tiny_shakespeare_val.bin");
  const std::string dir = "/tmp/gpt_data_test";
  std::system(("mkdir -p " + dir).c_str());
  auto trunc = bytes;
  trunc.resize(bytes.size() - 100);
  spit(dir + "/trunc.bin", trunc);
  CHECK_THROWS_WITH(read_shard_header(dir + "/trunc.bin"), "truncated");
  CHECK_THROWS_WITH(make_shard_source(dir + "/trunc.bin", 1, 8, 0, 1, 50257), "trunc.bin");
  auto magic = bytes;
  magic[0] ^= 0x5a;
  spit(dir + "/magic.bin", magic);
  CHECK_THROWS_WITH(read_shard_header(dir + "/magic.bin"), "magic");
  spit(dir + "/short.bin", std::vector<char>(bytes.begin(), bytes.begin() + 100));
  CHECK_THROWS_WITH(read_shard_header(dir + "/short.bin"), "header");
  CHECK_THROWS_WITH(make_shard_source(dir + "/none_*.bin", 1, 8, 0, 1, 50257), "no data files match");
  std::system(("rm -rf " + dir).c_str());
}

TEST(synthetic_corpus_follows_its_chain) {
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
      CHECK(tok[j] >= 0 && tok[j] < 50);
      succ[tok[j]].insert(tgt[j]);
    }
  }
  for (auto& s : succ) CHECK(s.size() == 3);  // exactly `branching` successors were seen
  CHECK_NEAR(synthetic_loss_floor(dc), std::log(3.0), 1e-12);
  // the val stream uses the same chain but other sequences
  auto val = make_synthetic_source(dc, 42, 1, 4, 32, 0, 1);
  std::vector<int> vt(128), vg(128);
  val->next(vt.data(), vg.data());
  bool differs = false;
  for (int j = 0; j < 128; ++j) {
    CHECK(succ[vt[j]].count(vg[j]) == 1);
    differs |= vt[j] != tok[j];
  }
  CHECK(differs);
  // positions restore exactly
  auto pos = src->position();
  src->next(tok.data(), tgt.data());
  auto again = make_synthetic_source(dc, 42, 0, 4, 32, 0, 1);
  again->seek(pos);
  again->next(vt.data(), vg.data());
  CHECK(vt == tok);
}

int main(int argc, char** argv) { return check::run_all(argc > 1 ? argv[1] : nullptr); }
