// Training data: llm.c token shards over a glob, or the built-in synthetic corpus. Every rank reads
// its own rows of each global micro-batch, so N ranks with micro-batch b see exactly what one rank
// with micro-batch N*b sees.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

struct DataConfig;

// Where a source stands; saved in checkpoints.
struct DataPosition {
  int64_t shard = 0;      // index into the sorted shard list (synthetic: 0)
  int64_t offset = 0;     // token offset of the next global micro-batch (synthetic: sequence counter)
  int64_t epoch = 0;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Fills B*T inputs and the B*T next-token targets of this rank's rows of the next micro-batch.
  virtual void next(int* tokens, int* targets) = 0;
  virtual DataPosition position() const = 0;
  virtual void seek(const DataPosition& p) = 0;
  virtual std::string describe() const = 0;
};

// A token shard's header, checked: magic 20240520, version 1, size = 1024 + 2 * n_tokens.
struct ShardInfo {
  std::string path;
  int64_t n_tokens = 0;
};
ShardInfo read_shard_header(const std::string& path);
std::vector<std::string> expand_glob(const std::string& pattern);  // sorted; error when nothing matches

// Shards matching `glob`; micro-batch rows B, sequence length T; this rank's place among world ranks.
std::unique_ptr<TokenSource> make_shard_source(const std::string& glob, int B, int T, int rank, int world,
                                               int vocab_size);
// A first-order Markov chain over ids [0, vocab): every token has `branching` equally likely successors,
// so the best achievable loss is ln(branching). `stream` selects independent sequences (train 0, val 1).
std::unique_ptr<TokenSource> make_synthetic_source(const DataConfig& dc, uint64_t seed, int stream, int B, int T,
                                                   int rank, int world);
double synthetic_loss_floor(const DataConfig& dc);

}  // namespace gpt
