#include "io/data.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/common.hpp"
#include "config/config.hpp"

namespace gpt {
namespace {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

struct File {
  FILE* f = nullptr;
  explicit File(const std::string& p) : f(std::fopen(p.c_str(), "rb")) {}
  ~File() {
    if (f) std::fclose(f);
  }
};

class ShardSource final : public TokenSource {
 public:
  ShardSource(std::vector<ShardInfo> shards, int B, int T, int rank, int world, int vocab)
      : shards_(std::move(shards)), B_(B), T_(T), rank_(rank), world_(world), vocab_(vocab) {
    const int64_t need = int64_t(world) * B * T + 1;
    for (auto& s : shards_)
      if (s.n_tokens < need)
        throw input_error("data shard '" + s.path + "' holds " + std::to_string(s.n_tokens) +
                          " tokens, fewer than one global micro-batch needs (" + std::to_string(need) +
                          " = world_size * micro_batch * seq_len + 1)");
    open(0);
  }
  void next(int* tokens, int* targets) override {
    const int64_t global = int64_t(world_) * B_ * T_;
    if (pos_.offset + global + 1 > shards_[pos_.shard].n_tokens) {
      int64_t s = pos_.shard + 1;
      if (s == int64_t(shards_.size())) {
        s = 0;
        ++pos_.epoch;
      }
      open(s);
      pos_.offset = 0;
    }
    const int64_t start = pos_.offset + int64_t(rank_) * B_ * T_;
    const size_t n = size_t(B_) * T_ + 1;
    buf_.resize(n);
    if (std::fseek(file_->f, long(kHeaderBytes + 2 * start), SEEK_SET) != 0 ||
        std::fread(buf_.data(), 2, n, file_->f) != n)
      throw input_error("data shard '" + shards_[pos_.shard].path + "': read failed at token " + std::to_string(start) +
                        " (file changed or truncated while training?)");
    for (size_t i = 0; i + 1 < n; ++i) {
      tokens[i] = buf_[i];
      targets[i] = buf_[i + 1];
      if (buf_[i] >= vocab_ || buf_[i + 1] >= vocab_)
        throw input_error("data shard '" + shards_[pos_.shard].path + "': token id " +
                          std::to_string(std::max(buf_[i], buf_[i + 1])) + " is outside the vocabulary (" +
                          std::to_string(vocab_) + ")");
    }
    pos_.offset += global;
  }
  DataPosition position() const override { return pos_; }
  void seek(const DataPosition& p) override {
    if (p.shard < 0 || p.shard >= int64_t(shards_.size()) || p.offset < 0 || p.offset > shards_[p.shard].n_tokens)
      throw input_error("data position (shard " + std::to_string(p.shard) + ", offset " + std::to_string(p.offset) +
                        ") does not fit the data set (" + std::to_string(shards_.size()) + " shards)");
    open(p.shard);
    pos_ = p;
  }
  std::string describe() const override {
    int64_t n = 0;
    for (auto& s : shards_) n += s.n_tokens;
    return std::to_string(shards_.size()) + " shard(s), " + std::to_string(n) + " tokens";
  }

 private:
  void open(int64_t s) {
    file_ = std::make_unique<File>(shards_[s].path);
    if (!file_->f) throw input_error("cannot open data shard '" + shards_[s].path + "'");
    pos_.shard = s;
  }
  std::vector<ShardInfo> shards_;
  int B_, T_, rank_, world_, vocab_;
  DataPosition pos_;
  std::unique_ptr<File> file_;
  std::vector<uint16_t> buf_;
};

class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(const DataConfig& dc, uint64_t seed, int stream, int B, int T, int rank, int world)
      : V_(dc.synthetic_vocab), K_(dc.synthetic_branching), stream_(stream), B_(B), T_(T), rank_(rank),
        world_(world), seed_(seed) {
    // the chain itself depends on the seed only: train and val streams share it
    succ_.resize(size_t(V_) * K_);
    std::vector<int> perm(V_);
    for (int u = 0; u < V_; ++u) {
      for (int i = 0; i < V_; ++i) perm[i] = i;
      uint64_t h = splitmix64(seed ^ (0xC0FFEEull + uint64_t(u)));
      for (int k = 0; k < K_; ++k) {  // partial Fisher-Yates: K distinct successors
        h = splitmix64(h);
        const int j = k + int(h % uint64_t(V_ - k));
        std::swap(perm[k], perm[j]);
        succ_[size_t(u) * K_ + k] = perm[k];
      }
    }
  }
  void next(int* tokens, int* targets) override {
    for (int r = 0; r < B_; ++r) {
      const uint64_t seq = uint64_t(pos_.offset) + uint64_t(rank_) * B_ + r;  // global sequence index
      uint64_t h = splitmix64(seed_ ^ (uint64_t(stream_ + 1) << 56) ^ splitmix64(seq));
      int cur = int(h % uint64_t(V_));
      for (int t = 0; t <= T_; ++t) {
        if (t < T_) tokens[r * T_ + t] = cur;
        if (t > 0) targets[r * T_ + t - 1] = cur;
        h = splitmix64(h);
        cur = succ_[size_t(cur) * K_ + int(h % uint64_t(K_))];
      }
    }
    pos_.offset += int64_t(world_) * B_;
  }
  DataPosition position() const override { return pos_; }
  void seek(const DataPosition& p) override { pos_ = p; }
  std::string describe() const override {
    return "synthetic Markov corpus: " + std::to_string(V_) + " tokens, " + std::to_string(K_) +
           " successors each (best loss ln " + std::to_string(K_) + ")";
  }

 private:
  int V_, K_, stream_, B_, T_, rank_, world_;
  uint64_t seed_;
  std::vector<int> succ_;
  DataPosition pos_;
};

}  // namespace

ShardInfo read_shard_header(const std::string& path) {
  File f(path);
  if (!f.f) throw input_error("cannot open data shard '" + path + "'");
  int32_t h[256];
  if (std::fread(h, sizeof(int32_t), 256, f.f) != 256)
    throw input_error("data shard '" + path + "' is truncated: shorter than its 1024-byte header");
  if (h[0] != kShardMagic)
    throw input_error("data shard '" + path + "' has magic number " + std::to_string(h[0]) + ", expected " +
                      std::to_string(kShardMagic) + " (not an llm.c token shard?)");
  if (h[1] != kShardVersion)
    throw input_error("data shard '" + path + "' has version " + std::to_string(h[1]) + ", expected " +
                      std::to_string(kShardVersion));
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw input_error("cannot stat data shard '" + path + "'");
  const int64_t want = int64_t(kHeaderBytes) + 2 * int64_t(h[2]);
  if (h[2] < 0 || st.st_size != want)
    throw input_error("data shard '" + path + "' is truncated or corrupt: header says " + std::to_string(h[2]) +
                      " tokens (" + std::to_string(want) + " bytes) but the file has " + std::to_string(st.st_size) +
                      " bytes");
  return {path, h[2]};
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) throw input_error("no data files match '" + pattern + "'");
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<TokenSource> make_shard_source(const std::string& pattern, int B, int T, int rank, int world,
                                               int vocab) {
  std::vector<ShardInfo> shards;
  for (auto& p : expand_glob(pattern)) shards.push_back(read_shard_header(p));
  return std::make_unique<ShardSource>(std::move(shards), B, T, rank, world, vocab);
}

std::unique_ptr<TokenSource> make_synthetic_source(const DataConfig& dc, uint64_t seed, int stream, int B, int T,
                                                   int rank, int world) {
  return std::make_unique<SyntheticSource>(dc, seed, stream, B, T, rank, world);
}

double synthetic_loss_floor(const DataConfig& dc) { return std::log(double(dc.synthetic_branching)); }

}  // namespace gpt
