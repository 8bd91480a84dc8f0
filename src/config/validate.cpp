// Every field and every combination checked once per run, before anything is written.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/common.hpp"
#include "config/config_io.hpp"
#include "config/fields.hpp"
#include "config/presets.hpp"
#include "optim/optimizer.hpp"

namespace gpt {

namespace {
[[noreturn]] void bad(const std::string& key, const std::string& why) {
  throw input_error("config error: " + key + ": " + why);
}

// No setting may be NaN or infinite (YAML's .nan and .inf parse as numbers, and 1e39 overflows a float).
void check_finite(const Config& cfg) {
  Config c = cfg;
  for (const config::Field& f : config::fields_of(c))
    if (float* const* p = std::get_if<float*>(&f.ref); p && !std::isfinite(**p))
      bad(f.key, "must be a finite number, got " + config::field_text(f));
}

// The keys that act only at training.precision fp8 (every training.fp8_* key of the field table): changed
// from their defaults at another precision they would be ignored without a word, so they are refused;
// fp8_classifier: false says what another precision does anyway (and older runs' configs stored it).
void check_fp8_only(const Config& cfg) {
  if (cfg.training.precision == Precision::fp8) return;
  Config c = cfg, defaults;
  const std::vector<config::Field> now = config::fields_of(c), was = config::fields_of(defaults);
  for (size_t i = 0; i < now.size(); ++i)
    if (std::string(now[i].key).rfind("training.fp8_", 0) == 0 && config::field_text(now[i]) != config::field_text(was[i]) &&
        !(now[i].key == std::string("training.fp8_classifier") && !cfg.training.fp8_classifier))  // bf16 anyway
      bad(now[i].key, std::string("needs training.precision: fp8 (it is ") + name_of(cfg.training.precision) + ")");
}
}  // namespace

void validate(const Config& cfg, int world) {
  check_finite(cfg);
  const auto& t = cfg.training;
  const auto& m = cfg.model;
  if (cfg.run.name.empty()) bad("run.name", "must not be empty");
  if (cfg.run.name.find("..") != std::string::npos) bad("run.name", "must not contain '..'");
  // the run's folder under run.out_dir: one name, printable on one line
  if (cfg.run.name.find_first_not_of(" \t") == std::string::npos)
    bad("run.name", "must not be only spaces (it names the run's folder under run.out_dir)");
  if (cfg.run.name == "." || cfg.run.name.front() == '/')
    bad("run.name", "'" + cfg.run.name + "' is not a folder name under run.out_dir (give a name such as 'base'; "
                    "run.out_dir says where runs go)");
  if (cfg.run.name.find_first_of("\n\r") != std::string::npos)
    bad("run.name", "must not contain a line break");
  if (cfg.run.out_dir.empty()) bad("run.out_dir", "must not be empty");
  // model: a preset or explicit dims
  ModelDims d;
  try {
    d = resolve_dims(m);
  } catch (const Error& e) {
    throw input_error(std::string("config error: ") + e.what());
  }
  if (t.seq_len < 1) bad("training.seq_len", "must be >= 1");
  if (t.seq_len > d.max_seq_len)
    bad("training.seq_len", std::to_string(t.seq_len) + " exceeds model.max_seq_len " + std::to_string(d.max_seq_len));
  if (!t.micro_batch.max && t.micro_batch.size < 1) bad("training.micro_batch", "must be >= 1 or 'max'");
  if (t.grad_accum < 1) bad("training.grad_accum", "must be >= 1");
  if (t.total_batch_tokens < 0) bad("training.total_batch_tokens", "must be >= 0");
  if (t.total_batch_tokens > 0 && !t.micro_batch.max) {
    int64_t per = int64_t(t.micro_batch.size) * t.seq_len * world;
    if (t.total_batch_tokens % per != 0)
      bad("training.total_batch_tokens", std::to_string(t.total_batch_tokens) +
                                             " is not a multiple of micro_batch * seq_len * world_size = " +
                                             std::to_string(per));
  }
  if (t.steps < 1) bad("training.steps", "must be >= 1");
  if (!(t.lr >= 0) || !std::isfinite(t.lr)) bad("training.lr", "must be a finite number >= 0");
  if (t.warmup_steps < 0) bad("training.warmup_steps", "must be >= 0");
  if (t.min_lr_frac < 0 || t.min_lr_frac > 1) bad("training.min_lr_frac", "must be in [0, 1]");
  for (const HyperInfo& h : optimizer_hypers())
    if (!h.accepts(t.hypers.at(h.name)))
      bad(h.key, h.requirement());
  if (t.weight_decay < 0) bad("training.weight_decay", "must be >= 0");
  if (t.grad_clip < 0) bad("training.grad_clip", "must be >= 0 (0 = off)");
  if (t.zero_stage < 0 || t.zero_stage > 3) bad("training.zero_stage", "must be 0, 1, 2 or 3");
  if (t.offload == Offload::optimizer && t.zero_stage == 3)
    bad("training.offload", "'optimizer' works with training.zero_stage 0, 1 or 2, not 3 (the parameters' "
                            "shards are gathered on the device)");
  if (t.gradient_release) {
    // memory_fit: auto with the split left open chooses one micro-batch a step for it
    const bool split_open = t.memory_fit == MemoryFit::automatic && !cfg.set_keys.count("training.micro_batch") &&
                            !(cfg.set_keys.count("training.grad_accum") && t.total_batch_tokens == 0);
    const int64_t accum = t.total_batch_tokens > 0 && !t.micro_batch.max
                              ? t.total_batch_tokens / (int64_t(t.micro_batch.size) * t.seq_len * world)
                              : t.grad_accum;
    const char* why =
        t.grad_clip > 0 ? "training.grad_clip 0 (clipping by the global norm needs every gradient before the first "
                          "update)"
        : accum > 1 && !split_open ? "one micro-batch a step (grad_accum 1: accumulation needs the whole model's "
                                     "gradients)"
        : t.offload == Offload::optimizer ? "training.offload none (the offloaded update is pipelined after the backward)"
                                          : nullptr;
    if (why) bad("training.gradient_release", std::string("'true' needs ") + why);
  }
  if (t.recompute < 0 || t.recompute > 3) bad("training.recompute", "must be 0, 1, 2 or 3");
  if (t.logits_chunk < 0) bad("training.logits_chunk", "must be >= 0 (0 = 8192 rows)");
  if (!(t.matmul_search_s >= 0 && t.matmul_search_s <= 60))
    bad("training.matmul_search_s", "must be between 0 and 60 (seconds per matmul shape; 0 = no search)");
  if (t.memory_limit_gb < 0) bad("training.memory_limit_gb", "must be >= 0 (0 = the device's memory)");
  if (t.micro_batch.max && t.memory_fit == MemoryFit::automatic)
    bad("training.micro_batch", "'max' cannot be combined with training.memory_fit: auto, which chooses the "
                                "micro-batch itself (among the divisors of the global batch)");
  if (t.micro_batch.max && t.total_batch_tokens > 0)
    bad("training.micro_batch", "'max' cannot be combined with training.total_batch_tokens (use grad_accum)");
  if (t.fp8_amax_history < 1 || t.fp8_amax_history > 1024) bad("training.fp8_amax_history", "must be 1-1024");
  if (t.fp8_margin < 0 || t.fp8_margin > 8) bad("training.fp8_margin", "must be 0-8");
  check_fp8_only(cfg);
  if (!find_optimizer(t.optimizer)) {
    std::string known;
    for (const OptimizerInfo& o : optimizers()) known += (known.empty() ? "" : ", ") + o.name;
    bad("training.optimizer", "'" + t.optimizer + "' is not one of " + known);
  }
  optim::StateType state_type;
  if (!optim::parse_state_type(t.optimizer_state, state_type))
    bad("training.optimizer_state", "'" + t.optimizer_state + "' is not one of fp32, bf16, int8");
  if (t.precision == Precision::fp8 && (d.n_embd % 16 != 0 || t.seq_len % 16 != 0))
    bad("training.precision", "fp8 needs model.n_embd and training.seq_len to be multiples of 16 (FP8 tensor "
                              "cores); they are " + std::to_string(d.n_embd) + " and " + std::to_string(t.seq_len));
  if (t.precision == Precision::fp8) {
    std::vector<bool> fp8_layers;
    try {
      fp8_layers = parse_layer_set(t.fp8_layers, d.n_layer, "training.fp8_layers");
    } catch (const Error& e) {
      throw input_error(std::string("config error: ") + e.what());
    }
    unsigned products = 0;
    try {
      products = parse_product_set(t.fp8_products, "training.fp8_products");
    } catch (const Error& e) {
      throw input_error(std::string("config error: ") + e.what());
    }
    if ((products & 8u) && !(products & 4u))  // kBlockProducts: fcproj, fc
      bad("training.fp8_products", "'" + t.fp8_products + "' has fcproj without fc: GELU's derivative is applied in "
                                   "fc's FP8 gradient cast, so fcproj in FP8 needs fc in FP8 too");
    if (t.fp8_gelu_epilogue && cfg.model.activation != Activation::gelu)
      bad("training.fp8_gelu_epilogue", std::string("true needs model.activation gelu (cuBLASLt's epilogue applies GELU "
                                        "only); it is ") + name_of(cfg.model.activation));
    if (std::find(fp8_layers.begin(), fp8_layers.end(), true) == fp8_layers.end() && !t.fp8_classifier)
      bad("training.fp8_layers", "'" + t.fp8_layers + "' with training.fp8_classifier: false leaves no product in "
                                 "FP8 (for that, set training.precision: bf16)");
  }
  if (t.precision == Precision::fp8 && t.logits_chunk % 16 != 0)
    bad("training.logits_chunk", "precision fp8 needs a multiple of 16 (the FP8 classifier's products); it is " +
                                     std::to_string(t.logits_chunk));
  const auto& dc = cfg.data;
  if (dc.synthetic) {
    if (!dc.train.empty()) bad("data.synthetic", "set either data.synthetic or data.train, not both");
    if (dc.synthetic_vocab < 2 || dc.synthetic_vocab > d.vocab_size)
      bad("data.synthetic_vocab", "must be in [2, model vocab_size]");
    if (dc.synthetic_branching < 1 || dc.synthetic_branching > dc.synthetic_vocab)
      bad("data.synthetic_branching", "must be in [1, data.synthetic_vocab]");
  } else if (dc.train.empty()) {
    bad("data.train", "no training data: give a glob of token shards or set data.synthetic: true");
  }
  if (cfg.eval.every < 0) bad("eval.every", "must be >= 0");
  const auto& ev = cfg.eval;
  if (ev.every > 0 && !dc.synthetic && dc.val.empty() && ev.hellaswag.empty() && ev.sample_tokens == 0)
    bad("eval.every", std::to_string(ev.every) + " asks for an evaluation every " + std::to_string(ev.every) +
                          " steps, but there is nothing to evaluate: data.val is empty and neither eval.hellaswag "
                          "nor eval.sample_tokens is set; give validation shards in data.val, or set eval.every: 0");
  if (!ev.batches.all && ev.batches.count < 0) bad("eval.batches", "must be >= 0 or 'all'");
  if (ev.batches.all && (dc.synthetic || dc.val.empty()))
    bad("eval.batches", "'all' needs validation shards in data.val (the synthetic corpus has no end)");
  if (ev.sample_tokens < 0) bad("eval.sample_tokens", "must be >= 0");
  if (!(ev.sample_temperature >= 0) || !std::isfinite(ev.sample_temperature))
    bad("eval.sample_temperature", "must be a finite number >= 0 (0 = greedy)");
  if (!ev.merges.empty() && ev.vocab.empty())
    bad("eval.merges", "'" + ev.merges + "' needs eval.vocab to name GPT-2's vocab.json beside it");
  if (cfg.log.every < 1) bad("log.every", "must be >= 1");
  if (cfg.checkpoint.every < 0) bad("checkpoint.every", "must be >= 0");
  if (cfg.checkpoint.keep_last < 1) bad("checkpoint.keep_last", "must be >= 1");
  if (cfg.checkpoint.threads < 1 || cfg.checkpoint.threads > 64) bad("checkpoint.threads", "must be 1-64");
  if (!(cfg.checkpoint.stall_s > 0)) bad("checkpoint.stall_s", "must be > 0 seconds");
  if (!(m.init_std > 0)) bad("model.init_std", "must be > 0");
  // (an untied head starts from a Hugging Face folder only: the llm.c file's reader says so)
  if (const std::string other = non_gpt2_structure(m, true); !m.init_from.empty() && !other.empty())
    bad("model.init_from", "llm.c model files and Hugging Face GPT-2 folders hold GPT-2's structure; a model with " +
                               other + " cannot start from one");
}

}  // namespace gpt
