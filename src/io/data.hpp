// Training data: llm.c token shards over a glob, or the built-in synthetic corpus. A shard is a list of
// sequences of T tokens (sequence i starts at token i*T and reads T+1 for its targets); a global
// micro-batch is the next world*B sequences of one shard, and every rank reads its own B of them, so N
// ranks with micro-batch b see exactly what one rank with micro-batch N*b sees. What is left of a shard
// after its last whole global micro-batch (fewer than world*B sequences) is skipped that epoch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

struct DataConfig;

// Where a source stands; saved in checkpoints. With `shuffled`, shard and offset count places in the
// epoch's orders (a pure function of seed and epoch), so the position and the seed resume bit for bit.
struct DataPosition {
  int64_t shard = 0;      // place in the epoch's shard order: the sorted list, or its shuffle (synthetic: 0)
  int64_t offset = 0;     // sequence place of the next global micro-batch, times T: in file order the token
                          // offset (synthetic: sequence counter)
  int64_t epoch = 0;
  bool shuffled = false;  // the orders are shuffled (data.shuffle)
};

// The order a shard source reads in: file order, or with shuffle, each epoch a permutation of the
// shards and, inside each shard, of its sequences, drawn from (seed, epoch) and the same on every rank.
struct ShardOrder {
  bool shuffle = false;
  uint64_t seed = 0;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Fills B*T inputs and the B*T next-token targets of this rank's rows of the next micro-batch.
  virtual void next(int* tokens, int* targets) = 0;
  virtual DataPosition position() const = 0;
  virtual void seek(const DataPosition& p) = 0;
  virtual std::string describe() const = 0;
  // Global micro-batches in one pass over the data (an epoch); -1 when it has no end (synthetic).
  virtual int64_t epoch_batches() const = 0;
};

// A token shard's header, checked: magic 20240520, version 1, size = 1024 + 2 * n_tokens.
struct ShardInfo {
  std::string path;
  int64_t n_tokens = 0;
};
ShardInfo read_shard_header(const std::string& path);
std::vector<std::string> expand_glob(const std::string& pattern);  // sorted; error when nothing matches
// Every token id of the shard below vocab_size, read in 2 MiB pieces; an input error names the shard,
// the token's place and its id. Set-up scans the validation shards with it, so a bad id is named before
// any training rather than at the first evaluation (train shards are checked as they are read).
void check_shard_tokens(const ShardInfo& shard, int vocab_size);

// Shards matching `glob`; micro-batch rows B, sequence length T; this rank's place among world ranks.
std::unique_ptr<TokenSource> make_shard_source(const std::string& glob, int B, int T, int rank, int world,
                                               int vocab_size, const ShardOrder& order = {});
// A permutation of [0, n) drawn from key (Fisher-Yates over SplitMix64): the shuffles' one source.
std::vector<uint32_t> permutation(uint32_t n, uint64_t key);
// A first-order Markov chain over ids [0, vocab): every token has `branching` equally likely successors,
// so the best achievable loss is ln(branching). `stream` selects independent sequences (train 0, val 1).
std::unique_ptr<TokenSource> make_synthetic_source(const DataConfig& dc, uint64_t seed, int stream, int B, int T,
                                                   int rank, int world);
double synthetic_loss_floor(const DataConfig& dc);

}  // namespace gpt
