// One typed config for a run, filled from YAML, overridable with --set, validated in one place.
// The initialisers below are the defaults; each field's documentation is its entry in the field table
// (src/config/fields.cpp), which `./train --config-reference` prints as docs/CONFIG.md.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "base/common.hpp"
#include "base/fp8_math.hpp"
#include "config/structure.hpp"
#include "optim/hypers.hpp"

namespace gpt {

// The keys whose values are one of a few names are enums; enum_names<E>() lists the names in the order
// of E's values (what YAML holds, and what messages and docs/CONFIG.md show).
enum class Device : uint8_t { automatic, cpu, cuda };       // training.device: auto / cpu / cuda
enum class Precision : uint8_t { bf16, fp32, fp8 };          // training.precision
enum class Schedule : uint8_t { cosine, linear, constant };  // training.schedule
enum class ResumeMode : uint8_t { never, automatic };        // checkpoint.resume: never / auto
enum class OnError : uint8_t { stop, go_on };                // checkpoint.on_error: stop / continue
enum class SharedGpu : uint8_t { refuse, host };             // parallel.shared_gpu: refuse / host
enum class MasterWeights : uint8_t { none, fp32, compensated };  // training.master_weights (true / false: fp32 / none)
enum class MemoryFit : uint8_t { off, automatic };           // training.memory_fit: off / auto
enum class Offload : uint8_t { none, optimizer };            // training.offload
using Fp8Format = fp8::Format;                               // training.fp8_grad_format: e4m3 / e5m2
using Fp8FastAccum = fp8::FastAccum;                         // training.fp8_fast_accum

// EnumNames (base/common.hpp) of the keys' other enums
template <> struct EnumNames<Device> { static constexpr const char* names[] = {"auto", "cpu", "cuda"}; };
template <> struct EnumNames<Precision> { static constexpr const char* names[] = {"bf16", "fp32", "fp8"}; };
template <> struct EnumNames<Schedule> { static constexpr const char* names[] = {"cosine", "linear", "constant"}; };
template <> struct EnumNames<ResumeMode> { static constexpr const char* names[] = {"never", "auto"}; };
template <> struct EnumNames<OnError> { static constexpr const char* names[] = {"stop", "continue"}; };
template <> struct EnumNames<SharedGpu> { static constexpr const char* names[] = {"refuse", "host"}; };
template <> struct EnumNames<MasterWeights> {  // a boolean key once: false none, true fp32
  static constexpr const char* names[] = {"none", "fp32", "compensated"};
  static constexpr bool bool_names = true;
};
template <> struct EnumNames<MemoryFit> { static constexpr const char* names[] = {"off", "auto"}; };
template <> struct EnumNames<Offload> { static constexpr const char* names[] = {"none", "optimizer"}; };
template <> struct EnumNames<Fp8Format> { static constexpr const char* names[] = {"e4m3", "e5m2"}; };
template <> struct EnumNames<Fp8FastAccum> { static constexpr const char* names[] = {"forward", "dinp", "all"}; };
template <class E>
const char* name_of(E e) {
  return EnumNames<E>::names[static_cast<int>(e)];
}

// training.micro_batch: a number of sequences, or `max` (the largest that fits, searched at start).
struct MicroBatch {
  int size = 4;          // sequences per rank per micro-step (when not max)
  bool max = false;      // `max`: size is unknown until the search at start has run
  static MicroBatch fixed(int n) { return {n, false}; }
  bool operator==(const MicroBatch& o) const { return max == o.max && (max || size == o.size); }
};

// eval.batches: a number of micro-batches, or `all` (one whole pass over the validation shards).
struct EvalBatches {
  int count = 8;         // micro-batches per validation (when not all)
  bool all = false;
  static EvalBatches fixed(int n) { return {n, false}; }
};

struct RunConfig {
  std::string name = "run";
  std::string out_dir = "runs";
  uint64_t seed = 1337;
  bool overwrite = false;
};

struct ModelConfig {
  std::string preset = "";
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 50257;
  int max_seq_len = 1024;
  GPT_MODEL_STRUCTURE(GPT_STRUCTURE_FIELD)  // the structural choices: config/structure.hpp
  std::string init_from = "";
  float init_std = 0.02f;
};

struct DataConfig {
  std::string train = "";
  std::string val = "";
  bool synthetic = false;
  int synthetic_vocab = 256;
  int synthetic_branching = 4;
  bool shuffle = true;
  bool allow_changed_files = false;
};

struct TrainingConfig {
  Device device = Device::automatic;
  Precision precision = Precision::bf16;
  Fp8Format fp8_grad_format = Fp8Format::E5M2;
  int fp8_amax_history = 16;
  int fp8_margin = 0;
  bool fp8_classifier = true;
  std::string fp8_layers = "all";
  std::string fp8_products = "all";
  bool fp8_gelu_epilogue = false;
  bool fp8_weight_gather = true;
  Fp8FastAccum fp8_fast_accum = Fp8FastAccum::dinp;
  MasterWeights master_weights = MasterWeights::fp32;
  bool stochastic_rounding = true;
  MicroBatch micro_batch;
  int seq_len = 256;
  int grad_accum = 1;
  int64_t total_batch_tokens = 0;
  int steps = 100;
  float lr = 6e-4f;
  int warmup_steps = 0;
  Schedule schedule = Schedule::cosine;
  std::string optimizer = "adamw";
  std::string optimizer_state = "fp32";  // fp32 | bf16 | int8 (optim/state.hpp)
  Offload offload = Offload::none;
  bool gradient_release = false;
  float min_lr_frac = 0.0f;
  HyperValues hypers = default_hypers();  // the optimizers' own: training.beta1, ... (optim/hypers.hpp)
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;
  int zero_stage = 0;
  int recompute = 0;
  int logits_chunk = 0;  // rows of logits at a time; 0: kDefaultLogitsChunk (model/gpt.hpp)
  float memory_limit_gb = 0;
  MemoryFit memory_fit = MemoryFit::off;
  float matmul_search_s = 0;
  bool deterministic = false;
};

struct ParallelConfig {
  SharedGpu shared_gpu = SharedGpu::refuse;
};

struct EvalConfig {
  int every = 0;
  EvalBatches batches;
  std::string hellaswag = "";
  int sample_tokens = 0;
  std::string sample_prompt = "";
  float sample_temperature = 1.0f;
  std::string vocab = "";
  std::string merges = "";
};

struct LogConfig {
  int every = 1;
  bool progress = true;
  bool op_profile = false;
  bool csv = false;
};

struct CheckpointConfig {
  int every = 0;
  int keep_last = 2;
  ResumeMode resume = ResumeMode::never;
  bool async = true;
  OnError on_error = OnError::stop;
  int threads = 4;
  float stall_s = 300;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  ParallelConfig parallel;
  EvalConfig eval;
  LogConfig log;
  CheckpointConfig checkpoint;
  // What reading the config decided for the user that the keys alone do not show (a preset from the
  // command line replacing the file's dims), printed with the plan; not a key, never stored.
  std::vector<std::string> notes;
  // The dotted keys the YAML, the command line or a sweep point gave, whatever their value (what
  // training.memory_fit: auto keeps as given); not a key, never stored.
  std::set<std::string> set_keys;
};

}  // namespace gpt
