// One typed config for a run, filled from YAML, overridable with --set, validated in one place.
// Every field's default is the initialiser below; docs/CONFIG.md documents them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct RunConfig {
  std::string name = "run";        // run directory name under out_dir
  std::string out_dir = "runs";    // parent of the run directory
  uint64_t seed = 1337;            // initialisation, data order and stochastic rounding
};

struct ModelConfig {
  std::string preset = "";         // d12 | d24 | d36 | d48 (GPT-2 124M/350M/774M/1558M) | tiny; or the dims below
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 50257;          // real vocabulary; padded to a multiple of 128 internally
  int max_seq_len = 1024;
  std::string init_from = "";      // llm.c model file (fp32 or bf16) to start from
  float init_std = 0.02f;          // normal init std (residual projections scaled by 1/sqrt(2*n_layer))
};

struct DataConfig {
  std::string train = "";          // glob of llm.c token shards
  std::string val = "";            // glob of llm.c token shards (empty: no validation unless synthetic)
  bool synthetic = false;          // the built-in Markov corpus (best loss = ln(synthetic_branching))
  int synthetic_vocab = 256;       // number of token ids the corpus uses (ids 0..synthetic_vocab-1)
  int synthetic_branching = 4;     // each token has this many equally likely successors
};

struct TrainingConfig {
  std::string device = "auto";     // auto | cpu | cuda
  std::string precision = "bf16";  // bf16 | fp32 (on CPU always fp32)
  bool master_weights = true;      // fp32 master copy of bf16 parameters
  bool stochastic_rounding = true; // round bf16 parameter writes stochastically
  int micro_batch = 4;             // sequences per rank per micro-step; -1 = "max" (largest that fits)
  int seq_len = 256;
  int grad_accum = 1;              // micro-steps per optimizer step
  int64_t total_batch_tokens = 0;  // if > 0: grad_accum = total / (micro_batch * seq_len * world)
  int steps = 100;                 // optimizer steps
  float lr = 6e-4f;
  int warmup_steps = 0;
  std::string schedule = "cosine"; // cosine | linear | constant (after warmup)
  float min_lr_frac = 0.0f;        // final lr = lr * min_lr_frac
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;       // on 2-D weights only
  float grad_clip = 1.0f;          // global L2 norm; 0 = off
  int zero_stage = 0;              // 0..3
  int recompute = 0;               // 0 none, 1 GELU, 2 GELU and LayerNorm
  bool deterministic = false;      // true: bit-reproducible GPU steps (deterministic attention backward,
                                   // cuBLASLt's first-choice algorithms) at some speed; false: fastest
  float matmul_search_s = 0;       // GPU fast mode: seconds a big matmul's cuBLASLt configurations beyond the
                                   // heuristic's may be timed on first use; 0 = the heuristic's candidates only
  float memory_limit_gb = 0;       // per-rank budget (GiB) for micro_batch max; 0 = the GPU's memory. On CPU the prediction is checked against it
};

struct EvalConfig {
  int every = 0;                   // steps between validations; 0 = only after the last step
  int batches = 8;                 // micro-batches per validation
};

struct LogConfig {
  int every = 1;                   // steps between log rows
  bool progress = true;            // progress bar with ETA on a terminal
  bool op_profile = false;         // time every op of every training step; table at the end
};

struct CheckpointConfig {
  int every = 0;                   // steps between checkpoints; 0 = none (signals still checkpoint)
  int keep_last = 2;               // checkpoints kept; older ones are deleted
  std::string resume = "never";    // never | auto (continue from the latest valid checkpoint)
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  EvalConfig eval;
  LogConfig log;
  CheckpointConfig checkpoint;
};

}  // namespace gpt
