#include "io/data.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/common.hpp"
#include "base/input_file.hpp"
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

// Keys of the two shuffles: the shard order of an epoch, and the sequence order of a shard in an epoch.
uint64_t shard_order_key(uint64_t seed, int64_t epoch) {
  return splitmix64(seed ^ 0x5A4D0000ull ^ splitmix64(uint64_t(epoch)));
}
uint64_t sequence_order_key(uint64_t seed, int64_t epoch, int64_t shard) {
  return splitmix64(shard_order_key(seed, epoch) ^ splitmix64(0x5E90000ull + uint64_t(shard)));
}

class ShardSource final : public TokenSource {
 public:
  ShardSource(std::vector<ShardInfo> shards, int B, int T, int rank, int world, int vocab, const ShardOrder& order)
      : shards_(std::move(shards)), B_(B), T_(T), rank_(rank), world_(world), vocab_(vocab), order_(order) {
    const int64_t need = int64_t(world) * B * T + 1;
    for (auto& s : shards_)
      if (s.n_tokens < need)
        throw input_error("data shard '" + s.path + "' holds " + std::to_string(s.n_tokens) +
                          " tokens, fewer than one global micro-batch needs (" + std::to_string(need) +
                          " = world_size * micro_batch * seq_len + 1)");
    pos_.shuffled = order.shuffle;
    open(pos_);
  }
  void next(int* tokens, int* targets) override {
    const int64_t global = int64_t(world_) * B_ * T_;
    if (pos_.offset + global + 1 > shards_[file_shard_].n_tokens) {
      DataPosition p = pos_;
      p.offset = 0;
      if (++p.shard == int64_t(shards_.size())) {
        p.shard = 0;
        ++p.epoch;
      }
      open(p);
    }
    const int64_t row0 = int64_t(rank_) * B_;  // this rank's first row of the global micro-batch
    buf_.resize(size_t(T_) + 1);
    for (int r = 0; r < B_; ++r) {
      // in file order the offset is a token offset (what checkpoints have always held)
      read_sequence(order_.shuffle ? int64_t(seq_order_[size_t(pos_.offset / T_ + row0 + r)]) * T_
                                   : pos_.offset + (row0 + r) * T_);
      for (int t = 0; t < T_; ++t) {
        tokens[r * T_ + t] = buf_[t];
        targets[r * T_ + t] = buf_[t + 1];
      }
    }
    pos_.offset += global;
  }
  DataPosition position() const override { return pos_; }
  void seek(const DataPosition& p) override {
    if (p.shuffled != order_.shuffle)
      throw input_error(std::string("data.shuffle: the data position to resume was saved with data.shuffle: ") +
                        (p.shuffled ? "true" : "false") + "; set data.shuffle: " + (p.shuffled ? "true" : "false") +
                        " to continue this run");
    if (p.shard < 0 || p.shard >= int64_t(shards_.size()) || p.offset < 0 || p.epoch < 0)
      throw input_error("data position (shard " + std::to_string(p.shard) + ", offset " + std::to_string(p.offset) +
                        ") does not fit the data set (" + std::to_string(shards_.size()) + " shards)");
    open(p);
    if (p.offset > shards_[file_shard_].n_tokens || (order_.shuffle && p.offset % T_ != 0))
      throw input_error("data position (shard " + std::to_string(p.shard) + ", offset " + std::to_string(p.offset) +
                        ") does not fit shard '" + shards_[file_shard_].path + "' at training.seq_len " +
                        std::to_string(T_));
  }
  std::string describe() const override {
    int64_t n = 0;
    for (auto& s : shards_) n += s.n_tokens;
    return std::to_string(shards_.size()) + " shard(s), " + std::to_string(n) + " tokens" +
           (order_.shuffle ? ", shuffled each epoch" : "");
  }
  int64_t epoch_batches() const override {
    const int64_t per = int64_t(world_) * B_;
    int64_t n = 0;
    for (auto& s : shards_) n += (s.n_tokens - 1) / T_ / per;
    return n;
  }

 private:
  // Moves to place p.shard of epoch p.epoch's shard order: opens that shard and draws its sequence order.
  void open(const DataPosition& p) {
    if (order_.shuffle && (shard_order_.empty() || p.epoch != pos_.epoch))
      shard_order_ = permutation(uint32_t(shards_.size()), shard_order_key(order_.seed, p.epoch));
    const int64_t s = order_.shuffle ? int64_t(shard_order_[size_t(p.shard)]) : p.shard;
    file_ = std::make_unique<File>(shards_[s].path);
    if (!file_->f) throw input_error("cannot open data shard '" + shards_[s].path + "'");
    if (order_.shuffle)
      seq_order_ = permutation(uint32_t((shards_[s].n_tokens - 1) / T_), sequence_order_key(order_.seed, p.epoch, s));
    file_shard_ = s;
    pos_ = p;
  }
  // T+1 tokens from token `start` of the open shard into buf_, checked against the vocabulary.
  void read_sequence(int64_t start) {
    const size_t n = size_t(T_) + 1;
    if (std::fseek(file_->f, long(kHeaderBytes + 2 * start), SEEK_SET) != 0 ||
        std::fread(buf_.data(), 2, n, file_->f) != n)
      throw input_error("data shard '" + shards_[file_shard_].path + "': read failed at token " +
                        std::to_string(start) + " (file changed or truncated while training?)");
    for (size_t i = 0; i < n; ++i)
      if (buf_[i] >= vocab_)
        throw input_error("data shard '" + shards_[file_shard_].path + "': token id " + std::to_string(buf_[i]) +
                          " is outside the vocabulary (" + std::to_string(vocab_) + ")");
  }
  std::vector<ShardInfo> shards_;
  int B_, T_, rank_, world_, vocab_;
  ShardOrder order_;
  DataPosition pos_;
  int64_t file_shard_ = 0;              // index into shards_ of the open file
  std::vector<uint32_t> shard_order_;   // shuffle: this epoch's shard order
  std::vector<uint32_t> seq_order_;     // shuffle: the open shard's sequence order this epoch
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
    std::vector<int> perm(V_), swapped(K_);
    for (int i = 0; i < V_; ++i) perm[i] = i;
    for (int u = 0; u < V_; ++u) {
      uint64_t h = splitmix64(seed ^ (0xC0FFEEull + uint64_t(u)));
      for (int k = 0; k < K_; ++k) {  // partial Fisher-Yates from the identity: K distinct successors
        h = splitmix64(h);
        const int j = k + int(h % uint64_t(V_ - k));
        std::swap(perm[k], perm[j]);
        swapped[k] = j;
        succ_[size_t(u) * K_ + k] = perm[k];
      }
      for (int k = K_ - 1; k >= 0; --k) std::swap(perm[k], perm[swapped[k]]);  // the identity again
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
  int64_t epoch_batches() const override { return -1; }
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

void check_shard_tokens(const ShardInfo& s, int vocab) {
  File f(s.path);
  if (!f.f || std::fseek(f.f, long(kHeaderBytes), SEEK_SET) != 0) throw input_error("cannot open data shard '" + s.path + "'");
  std::vector<uint16_t> buf(size_t(1) << 20);
  for (int64_t at = 0; at < s.n_tokens;) {
    const size_t n = size_t(std::min<int64_t>(int64_t(buf.size()), s.n_tokens - at));
    if (std::fread(buf.data(), 2, n, f.f) != n)
      throw input_error("data shard '" + s.path + "': read failed at token " + std::to_string(at) + " (truncated?)");
    for (size_t i = 0; i < n; ++i)
      if (buf[i] >= vocab)
        throw input_error("data shard '" + s.path + "': token " + std::to_string(at + int64_t(i)) + " is id " +
                          std::to_string(buf[i]) + ", outside the vocabulary (" + std::to_string(vocab) + ")");
    at += int64_t(n);
  }
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
  for (const std::string& path : out) check_input_file(path, "data file");
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<TokenSource> make_shard_source(const std::string& pattern, int B, int T, int rank, int world,
                                               int vocab, const ShardOrder& order) {
  std::vector<ShardInfo> shards;
  for (auto& p : expand_glob(pattern)) shards.push_back(read_shard_header(p));
  return std::make_unique<ShardSource>(std::move(shards), B, T, rank, world, vocab, order);
}

std::vector<uint32_t> permutation(uint32_t n, uint64_t key) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  uint64_t h = key;
  for (uint32_t i = n; i > 1; --i) {
    h = splitmix64(h);
    std::swap(p[i - 1], p[size_t(h % i)]);
  }
  return p;
}

std::unique_ptr<TokenSource> make_synthetic_source(const DataConfig& dc, uint64_t seed, int stream, int B, int T,
                                                   int rank, int world) {
  return std::make_unique<SyntheticSource>(dc, seed, stream, B, T, rank, world);
}

double synthetic_loss_floor(const DataConfig& dc) { return std::log(double(dc.synthetic_branching)); }

}  // namespace gpt
