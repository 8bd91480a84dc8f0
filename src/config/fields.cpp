#include "config/fields.hpp"

#include <algorithm>
#include <sstream>

#include "base/common.hpp"
#include "base/format.hpp"
#include "optim/optimizer.hpp"

namespace gpt::config {

namespace {
// training.optimizer's documentation: the optimizers there are (optim/rules.hpp), each with its own
std::string optimizer_doc_text() {
  std::string s = "the parameter update:";
  for (const OptimizerInfo& o : optimizers()) s += " `" + o.name + "` (" + o.doc + ");";
  s.back() = '.';
  return s;
}
const char* optimizer_doc() {
  static const std::string doc = optimizer_doc_text();  // built once from a constant table
  return doc.c_str();
}
}  // namespace

std::vector<Field> fields_of(Config& c) {
  RunConfig& r = c.run;
  ModelConfig& m = c.model;
  DataConfig& d = c.data;
  TrainingConfig& t = c.training;
  std::vector<Field> fs = {
      {"run.name", &r.name, "run directory name under out_dir"},
      {"run.out_dir", &r.out_dir, "parent of the run directory"},
      {"run.seed", &r.seed, "initialisation, data order and stochastic rounding"},
      {"run.overwrite", &r.overwrite,
       "a run without --resume into a directory that already holds a run (log.h5 or checkpoints) is an error; "
       "`true` deletes that run first"},
      {"model.preset", &m.preset,
       "d12 / d24 / d36 / d48 (GPT-2 124M/350M/774M/1558M) / tiny; or the dims below, not both. A preset given on "
       "the command line (or varied by a sweep) replaces the dims of the file, which the printed plan notes"},
      {"model.n_layer", &m.n_layer, "transformer blocks (without a preset)"},
      {"model.n_head", &m.n_head, "attention heads (without a preset); must divide n_embd"},
      {"model.n_embd", &m.n_embd, "model width (without a preset)"},
      {"model.vocab_size", &m.vocab_size, "real vocabulary; padded to a multiple of 128 internally"},
      {"model.max_seq_len", &m.max_seq_len,
       "the longest sequence (training.seq_len at most); the rows of the learned position embedding"},
#define GPT_STRUCTURE_KEY(type, name, gpt2, plan, always, hf, doc) {"model." #name, &m.name, doc},
      GPT_MODEL_STRUCTURE(GPT_STRUCTURE_KEY)  // config/structure.hpp
#undef GPT_STRUCTURE_KEY
      {"model.init_from", &m.init_from,
       "weights to start from: an llm.c model file (fp32 or bf16) or a Hugging Face GPT-2 folder (config.json, "
       "model.safetensors; e.g. `./train export --format hf`)"},
      {"model.init_std", &m.init_std, "normal init std (residual projections scaled by 1/sqrt(2*n_layer))"},
      {"data.train", &d.train, "glob of llm.c token shards"},
      {"data.val", &d.val, "glob of llm.c token shards (empty: no validation unless synthetic)"},
      {"data.synthetic", &d.synthetic, "the built-in Markov corpus (best loss = ln(synthetic_branching))"},
      {"data.synthetic_vocab", &d.synthetic_vocab, "number of token ids the corpus uses (ids 0..synthetic_vocab-1)"},
      {"data.synthetic_branching", &d.synthetic_branching, "each token has this many equally likely successors"},
      {"data.shuffle", &d.shuffle,
       "train shards: each epoch a new order of the shards and of the sequences inside each shard, drawn from "
       "run.seed and the epoch (the same on every rank); false: file order. Validation is never shuffled; the "
       "synthetic corpus has no order to shuffle"},
      {"data.allow_changed_files", &d.allow_changed_files,
       "resume even though the files behind data.train are not those the checkpoint was trained on (each "
       "run records their names, sizes and a hash of their first and last MiB): `false` refuses, naming "
       "the files added, removed or changed; `true` warns and goes on (the data position then points into "
       "other data)"},
      {"training.device", &t.device, "auto / cpu / cuda"},
      {"training.precision", &t.precision,
       "bf16 / fp32 / fp8 (on CPU activations are always fp32; fp8 there emulates the GPU's quantization). "
       "fp8: bf16 activations, the four block products of every layer on FP8 operands with per-tensor delayed "
       "scaling (E4M3 inputs and weights), fp32 master weights and AdamW state as in bf16; needs n_embd and "
       "seq_len multiples of 16. The training.fp8_* keys act only at fp8: at another precision a run refuses "
       "any of them set to other than its default"},
      {"training.fp8_grad_format", &t.fp8_grad_format,
       "precision fp8: the output gradients' format, e5m2 (wider range) or e4m3 (one more mantissa bit)"},
      {"training.fp8_amax_history", &t.fp8_amax_history,
       "precision fp8: steps of amax history each tensor's scale is derived from (the largest amax over them); "
       "1-1024"},
      {"training.fp8_margin", &t.fp8_margin,
       "precision fp8: each scale is divided by 2^margin below the largest that fits the amax history "
       "(headroom for values that grow between steps); 0-8"},
      {"training.fp8_classifier", &t.fp8_classifier,
       "precision fp8: the classifier (the output projection tied to wte) and its two gradient products on FP8 "
       "operands too: the final LayerNorm's output and wte E4M3, the logits' gradient in the gradients' format, "
       "written by the softmax + cross-entropy kernel; the logits themselves stay bf16; its input gradient, a "
       "sum over the vocabulary, keeps cuBLASLt's promotion to fp32 under every fp8_fast_accum setting. The "
       "default: the fastest FP8 policy that stays within 1% of bf16's loss on real text (bench/RESULTS.md). "
       "false: the classifier in bf16 (the only value accepted at another precision, where it is what happens)"},
      {"training.fp8_layers", &t.fp8_layers,
       "precision fp8: the layers whose four block products run on FP8 operands; the others run them in bf16 "
       "(a common recipe keeps the first and last blocks in bf16). `all`, `none` (only the classifier, with "
       "fp8_classifier), or layer numbers and ranges from 0, e.g. `1-46` or `0,2-5`. A LayerNorm writes FP8 "
       "exactly where the product it feeds is FP8; FP8 state, weight copies and their memory exist only for "
       "the FP8 layers"},
      {"training.fp8_products", &t.fp8_products,
       "precision fp8: which block products run on FP8 operands in the layers of fp8_layers; the others run "
       "in bf16 there. `all`, or some of `qkv`, `attproj`, `fc`, `fcproj` joined by commas (e.g. `qkv,fc,fcproj` "
       "keeps the attention projection in bf16). fcproj needs fc (GELU's derivative is applied in fc's FP8 "
       "gradient cast). A LayerNorm writes FP8 exactly where the product it feeds is FP8 (ln1: qkv, ln2: fc); "
       "FP8 state, weight copies and their memory exist only for the FP8 products; ZeRO-3 gathers a layer's "
       "weights as FP8 bytes only with all four"},
      {"training.fp8_gelu_epilogue", &t.fp8_gelu_epilogue,
       "precision fp8: GELU's output, fcproj's FP8 input, is written in FP8 by the fc product's cuBLASLt "
       "epilogue (its amax folded in per call). false: fc writes its output before GELU in bf16 and fcproj's "
       "input cast applies GELU on the way to FP8, keeping the bytes transposed for the weight gradient (as "
       "with recompute >= 1, which casts them again the same way in the backward); 0.5-1% faster a step on an "
       "H200 at GPT-2 124M and 1558M (bench/RESULTS.md)"},
      {"training.fp8_weight_gather", &t.fp8_weight_gather,
       "precision fp8 at zero_stage 3: each rank casts its own piece of the block products' weights to FP8 "
       "and the pieces are all-gathered as FP8 bytes (half the bytes of bf16), once per optimizer step; the "
       "backward uses the FP8 copies and gathers only the LayerNorm weights and biases. false: the weights are "
       "gathered in bf16 before every use and cast on every rank (the same FP8 bytes either way)"},
      {"training.fp8_fast_accum", &t.fp8_fast_accum,
       "precision fp8: which FP8 products sum without cuBLASLt's periodic promotion of the running sums to "
       "fp32 (fast accumulation; Hopper's tensor cores keep fewer bits of the sum in between): `forward` the "
       "forward products only (what Transformer Engine and torchao do); `dinp` also the input gradients, whose "
       "sums run over a layer's width (not the FP8 classifier's, over the vocabulary, which always promotes) (3-4% faster a step than `forward` on an H200 at GPT-2 1558M, "
       "bench/RESULTS.md); `all` also the weight gradients, whose sums run over a micro-batch's tokens (0-0.4% "
       "more). The CPU emulation sums in fp32 for all three"},
      {"training.master_weights", &t.master_weights,
       "what bf16 parameters are updated from: `fp32` (`true`) an fp32 master copy (4 bytes a parameter); "
       "`compensated` the parameter itself plus a bf16 residual (2 bytes a parameter), the master value "
       "param + residual to about 16 significant bits, the parameter written as its nearest bf16 (so "
       "`stochastic_rounding` does not apply) and the residual as the rest; checkpoints hold the master "
       "value in fp32 either way, so a run resumes under the other kind (compensated from fp32 rounds it "
       "to those 16 bits); `none` (`false`) the bf16 parameters alone, rounded as `stochastic_rounding` "
       "says. fp32 compute (the CPU) has no copy to keep"},
      {"training.stochastic_rounding", &t.stochastic_rounding, "round bf16 parameter writes stochastically"},
      {"training.micro_batch", &t.micro_batch,
       "sequences per rank per micro-step, or `max`: the largest that fits, found at start (on a GPU by trying "
       "forward/backward at each size, within `memory_limit_gb` when set; on the CPU by the memory prediction "
       "against `memory_limit_gb`); the size found is what the log and the summary record"},
      {"training.seq_len", &t.seq_len, "tokens per sequence"},
      {"training.grad_accum", &t.grad_accum, "micro-steps per optimizer step"},
      {"training.total_batch_tokens", &t.total_batch_tokens,
       "if > 0: grad_accum = total / (micro_batch * seq_len * world)"},
      {"training.steps", &t.steps, "optimizer steps"},
      {"training.lr", &t.lr, "peak learning rate"},
      {"training.warmup_steps", &t.warmup_steps, "linear warm-up steps"},
      {"training.schedule", &t.schedule, "cosine / linear / constant (after warmup)"},
      {"training.min_lr_frac", &t.min_lr_frac, "final lr = lr * min_lr_frac"},
      {"training.optimizer", &t.optimizer, optimizer_doc()},
      {"training.optimizer_state", &t.optimizer_state,
       "how every optimizer slot (AdamW's m and v, Lion's m) is held: `fp32` (4 bytes a value); `bf16` (2 bytes, "
       "written with stochastic rounding, so slowly decaying moments still decay); `int8` (1 byte a value and "
       "one fp32 scale, the absolute maximum, per block of 256: 1.016 bytes; logarithmic codes, signed for "
       "first moments and unsigned for second moments; docs/DESIGN.md, The optimizer). The CPU and the GPU "
       "write the same state bytes. A run resumes only under the state type it was written with"},
      {"training.offload", &t.offload,
       "where the optimizer runs: `none` on the device; `optimizer` the master weights and every optimizer "
       "slot in page-locked host memory and the update on the host's threads (OpenMP), so that the GPU holds "
       "only the parameters, gradients and activations. Each step, after the gradient norm (clipping needs "
       "it before any update), every bucket's gradient piece is copied to the host, updated there with the "
       "device's own arithmetic (the same bits: losses and checkpoints are those of `none`) and its new "
       "parameters copied back before the next forward, pipelined by bucket (the next bucket's gradients "
       "come down and the last one's parameters go up while the host updates one). ZeRO stages 0-2 (each "
       "rank offloads its shard), not 3. Checkpoints are the same either way, so a run resumes under the "
       "other setting. The dry run shows the host bytes per rank; the run log's /train/offload_ms the host's "
       "update time per step"},
      {"training.gradient_release", &t.gradient_release,
       "`true`: each bucket's optimizer update runs as soon as the backward has finished its gradient, and "
       "the gradient's buffer is reused by the next bucket, so that the whole model's gradients never exist "
       "(GPT-2 1558M in bf16: 2.63 GiB less, its 2.90 GiB of gradients for 0.27 GiB of bucket buffers). The "
       "same updates as `false`, bit for bit; the logged gradient "
       "norm is summed bucket by bucket. On several ranks (any ZeRO stage) each bucket is reduced on the "
       "communication stream as the backward goes on and updated (this rank's piece of it) once reduced. Needs "
       "what a bucket's update may not wait for: no gradient "
       "clipping (training.grad_clip 0: the global norm needs every gradient first), one micro-batch a "
       "step (grad_accum 1), training.offload none. memory_fit: auto weighs it where clipping is off "
       "(and keeps it, choosing one micro-batch a step, where it is given)"},
      {"training.weight_decay", &t.weight_decay, "decoupled, on 2-D weights only"},
      {"training.grad_clip", &t.grad_clip, "global L2 norm; 0 = off"},
      {"training.zero_stage", &t.zero_stage,
       "0..3: what is sharded across ranks (1: optimizer state, 2: and gradients, 3: and parameters)"},
      {"training.logits_chunk", &t.logits_chunk,
       "rows of logits the tied classifier computes at a time; 0 = 8192. Its buffers hold that many rows of "
       "the padded vocabulary (in the compute dtype, and as FP8 gradient bytes under the FP8 classifier): "
       "GPT-2 at micro-batch 4 x 1024 tokens keeps 4096 rows, 590 MiB under FP8, 1024 rows a quarter of it, "
       "for more and smaller products. The classifier's weight gradient then sums its chunks in another order, "
       "so runs with different chunk sizes are not bit-identical. memory_fit: auto also tries 1024 where it "
       "changes anything"},
      {"training.recompute", &t.recompute,
       "which activations the backward recomputes instead of keeping them from the forward. 0: every layer "
       "keeps its block's activations: both LayerNorms' outputs and statistics, qkv, attention's output and "
       "softmax statistics, the residual after attention, fc's output before and after GELU, the residual "
       "after the block (FP8: the products' inputs as FP8 bytes, attention's output also transposed). 1: "
       "GELU's output is recomputed from fc's (one buffer for all layers). 2: also both LayerNorms' outputs, "
       "from the residual stream (their statistics stay). 3: each layer keeps only its block's input (the "
       "residual stream entering it); each block's backward first runs the block's forward again, up to fc "
       "and attention's statistics included, into one set of buffers for all layers: the block inputs of "
       "all layers plus one block's working set, for about one more forward a step. The embeddings' output, "
       "the final LayerNorm's and the FP8 weight copies are kept at levels 0-2 with their transposes (the "
       "input gradients' operands). Level 3 keeps one layer's FP8 weight copies for all layers, cast again "
       "in each block's backward, and transposes each into one shared buffer when its backward needs it (the "
       "same bytes; one weight cast more a step); at ZeRO 3 with FP8 weight gathers each layer keeps its "
       "weight copies (the backward would gather them again). Level 3 gives bit-identical "
       "results to level 0 (FP8: recomputed with the forward's scales, the same bytes), and so does every level "
       "on the CPU and in FP8; on a GPU in bf16, levels 1 and 2 apply GELU to fc's stored bf16 output where "
       "the forward's epilogue applied it to the fp32 sums, so their gradients differ by that rounding. "
       "training.fp8_gelu_epilogue applies at level 0 only"},
      {"training.memory_limit_gb", &t.memory_limit_gb,
       "per-rank budget (GiB) for micro_batch max and memory_fit auto; 0 = the GPU's memory. On a GPU it bounds "
       "the whole process as nvidia-smi shows it: the trainer's allocations get it less 1.5 GiB, what the CUDA "
       "context and the libraries took beside them on an H100 (src/run/memory_fit.hpp). On CPU the prediction "
       "is checked against it"},
      {"training.memory_fit", &t.memory_fit,
       "`off`: the memory settings as given. `auto`: before the run (and in `--dry-run`) every combination of "
       "optimizer_state (fp32, bf16, int8), recompute (0-3), master_weights (fp32, compensated; `none` stays "
       "as it is), offload (none, optimizer: on a GPU at ZeRO 0-2, the host's update and the PCIe copies "
       "priced in; a run times the host's update on this machine, about 0.2 s per state type and master "
       "kind, a dry run takes a calibrated constant), gradient_release (with grad_clip 0: at one micro-batch a step without "
       "offload; taken only where it lets a faster or more precise combination fit) and micro-batch (each "
       "divisor of the global batch per rank, micro_batch x grad_accum or total_batch_tokens / seq_len / "
       "ranks, grad_accum making up the rest) gets its predicted memory per rank "
       "(the dry run's table) and its predicted step time (a model of an H100 step calibrated on measured "
       "steps, src/run/memory_fit.hpp), and the fastest that fits memory_limit_gb (0: the GPU's memory; the "
       "CPU needs it set) is taken; among combinations predicted within 10% of the fastest, the most precise "
       "optimizer state wins, then the most precise master weights. Keys given in the YAML, by --set or by the sweep keep their values, whatever "
       "they are: micro_batch (or grad_accum without total_batch_tokens) fixes the split. The choice and the "
       "runner-up are printed with their predicted bytes and time, and the choice is written into the "
       "resolved config (the run log, checkpoints, the summary); --resume keeps the choice of the checkpoint "
       "it continues from. Nothing fits: exit 3, naming the smallest prediction. Not with micro_batch `max`"},
      {"training.matmul_search_s", &t.matmul_search_s,
       "GPU, `deterministic: false`: on a matmul shape's first use, beyond the 8 candidates of cuBLASLt's "
       "heuristic, time the configurations around them (the algorithm's other tile sizes, cluster shapes and "
       "custom options) for up to this many seconds, for every product of at least 10 GFLOP; 0 = the "
       "heuristic's candidates only. With 1 s the step was 0-1.8% faster at GPT-2 124M and 0-1.1% at 1558M on "
       "an H200, and the first step 15-25 s longer (`bench/RESULTS.md`). 0-60"},
      {"training.deterministic", &t.deterministic,
       "GPU: `true` makes steps bit-reproducible across runs and resumes (cuDNN's deterministic attention "
       "backward, cuBLASLt's first-choice algorithms); `false` takes the fastest (non-deterministic attention "
       "backward, matmul algorithms timed on first use). The CPU path is always deterministic"},
      {"parallel.shared_gpu", &c.parallel.shared_gpu,
       "ranks that share a GPU (more ranks on a node than it has GPUs): `refuse` ends the run before any "
       "work, naming the node, its ranks and GPUs (NCCL takes one GPU per rank); `host` runs them, several "
       "ranks on each GPU, with collectives staged through page-locked host memory (each buffer copied out, "
       "MPI's collective on the host, copied back; bf16 sums reduced in fp32 and rounded once), for tests and "
       "memory measurements on a machine with fewer GPUs than ranks: each rank's device memory is what it "
       "would be on a GPU of its own (less NCCL's buffers), the throughput is not representative (the run log's `shared_gpu` attribute and the "
       "sweep's summary say so). On CPU ranks `host` runs the same staged collectives over plain copies"},
      {"eval.every", &c.eval.every,
       "steps between validations; 0 = only after the last step. > 0 needs something to evaluate: data.val (or "
       "the synthetic corpus), eval.hellaswag or eval.sample_tokens"},
      {"eval.batches", &c.eval.batches,
       "micro-batches per validation (the first ones of data.val, the same each time), or `all`: every whole "
       "global micro-batch of the validation shards"},
      {"eval.hellaswag", &c.eval.hellaswag,
       "HellaSwag token file (scripts/prepare_hellaswag.py; llm.c's eval format): at each evaluation every "
       "example is scored by the loss of each ending after its context, split across ranks, and the accuracy "
       "logged (`acc`: lowest summed loss, `acc_norm`: lowest mean loss per token); empty = none"},
      {"eval.sample_tokens", &c.eval.sample_tokens,
       "tokens to generate at each evaluation, printed and logged (each costs a forward pass over one "
       "micro-batch); 0 = none"},
      {"eval.sample_prompt", &c.eval.sample_prompt,
       "the sample's start: token ids separated by commas or spaces, or text (needs eval.vocab); empty = the "
       "last id of the vocabulary (GPT-2's end-of-text token, 50256)"},
      {"eval.sample_temperature", &c.eval.sample_temperature,
       "sampling temperature; 0 = greedy. The draws are seeded by run.seed and the step"},
      {"eval.vocab", &c.eval.vocab,
       "folder with GPT-2's vocab.json and merges.txt (scripts/prepare_data.py leaves them beside the shards), "
       "or with eval.merges the vocab.json file itself: samples are decoded to text and a text sample_prompt "
       "encoded; empty = samples are token ids"},
      {"eval.merges", &c.eval.merges,
       "GPT-2's merges.txt file; empty = merges.txt in eval.vocab's folder; set = eval.vocab names vocab.json "
       "itself (the same rule as the scripts' and export's --vocab FILE --merges FILE)"},
      {"log.every", &c.log.every, "steps between log rows"},
      {"log.progress", &c.log.progress,
       "progress bar with ETA when rank 0's output is an interactive terminal (never under an MPI launcher, "
       "whose output is forwarded: piped logs get no \\r lines)"},
      {"log.csv", &c.log.csv,
       "also write the metrics as train.csv and eval.csv beside log.h5 (a column per metric, a row per logged "
       "step and per evaluation, flushed as written; a resume keeps the rows up to its step)"},
      {"log.op_profile", &c.log.op_profile,
       "time every op of every training step (GPU: CUDA events; CPU: wall clock) and print, at the end, each "
       "op's milliseconds and share of the step and the idle time between ops; the warm-up step and evaluation "
       "are left out (slows the step slightly)"},
      {"checkpoint.every", &c.checkpoint.every, "steps between checkpoints; 0 = none (signals still checkpoint)"},
      {"checkpoint.keep_last", &c.checkpoint.keep_last, "checkpoints kept; older ones are deleted"},
      {"checkpoint.resume", &c.checkpoint.resume, "never / auto (continue from the latest valid checkpoint)"},
      {"checkpoint.async", &c.checkpoint.async,
       "`true`: the step that checkpoints queues copies of the state into host memory (the `snapshot` memory "
       "component, allocated and page-locked at the start when `every` > 0) and training goes on while they "
       "run (the next optimizer update waits for them on the device) and a thread writes the file; one "
       "checkpoint is in flight at most, and a signal or the end of the run waits for it. `false`: training "
       "waits for every checkpoint to be on disk"},
      {"checkpoint.on_error", &c.checkpoint.on_error,
       "a checkpoint that fails to write (a full disk): `stop` ends the run (exit 2); `continue` reports it "
       "on stderr and in the log's `message` and trains on, the previous checkpoint kept"},
      {"checkpoint.threads", &c.checkpoint.threads,
       "threads per rank writing checkpoint files, and reading them on resume (1-64), each hashing the "
       "bytes it moves; `export` and `sample` read with 4"},
      {"checkpoint.stall_s", &c.checkpoint.stall_s,
       "a run that fails (divergence, a bad shard, a failed log write, ...) first waits for the checkpoint "
       "being written in the background and publishes it; it waits as long as the write makes progress, "
       "and gives it up after this many seconds without a byte written (a hung filesystem; the file's final "
       "fsync shows no progress, so a filesystem that takes longer to flush a checkpoint needs more)"},
  };
  // the optimizers' own hyperparameters, as their rules declare them, before training.weight_decay
  auto at = std::find_if(fs.begin(), fs.end(),
                         [](const Field& f) { return std::string(f.key) == "training.weight_decay"; });
  for (const HyperInfo& h : optimizer_hypers())
    at = fs.insert(at, Field{h.key.c_str(), &t.hypers[h.name], h.doc.c_str()}) + 1;
  return fs;
}

const Field* find_field(const std::vector<Field>& fs, const std::string& key) {
  for (auto& f : fs)
    if (key == f.key) return &f;
  return nullptr;
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

namespace {

std::string where(const std::string& key, int line) {
  return line >= 0 ? key + " (line " + std::to_string(line + 1) + ")" : key;
}

template <class T>
T scalar_as(const YAML::Node& n, const std::string& key, int line, const std::string& what) {  // what: "an integer"
  if (!n.IsScalar())
    throw input_error("config error: " + where(key, line) + ": expected " + what + ", got " +
                      (n.IsSequence() ? "a list" : n.IsMap() ? "a mapping" : "no value"));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw input_error("config error: " + where(key, line) + ": expected " + what + ", got '" + n.Scalar() + "'");
  }
}

int int_from(const YAML::Node& n, const std::string& key, int line) {
  const long long v = scalar_as<long long>(n, key, line, "an integer");
  if (v < INT32_MIN || v > INT32_MAX)
    throw input_error("config error: " + where(key, line) + ": " + n.Scalar() + " is out of range");
  return int(v);
}

}  // namespace

std::string EnumRef::choices() const {
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(i ? ", " : "") + names[i];
  return s;
}

void set_field(const Field& f, const YAML::Node& n, int line) {
  const std::string key = f.key;
  if (const EnumRef* e = std::get_if<EnumRef>(&f.ref)) {
    const std::string v = scalar_as<std::string>(n, key, line, "one of " + e->choices());
    bool b = false;
    if (e->bool_names && YAML::convert<bool>::decode(n, b)) {
      *e->value = uint8_t(b ? 1 : 0);
      return;
    }
    for (int i = 0; i < e->n; ++i)
      if (v == e->names[i]) {
        *e->value = uint8_t(i);
        return;
      }
    throw input_error("config error: " + where(key, line) + ": '" + v + "' is not one of " + e->choices());
  }
  std::visit(
      [&](auto p) {
        if constexpr (std::is_same_v<decltype(p), EnumRef>) return;  // set above
        else {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = scalar_as<std::string>(n, key, line, "a string");
        } else if constexpr (std::is_same_v<T, bool>) {
          *p = scalar_as<bool>(n, key, line, "a boolean (true/false)");
        } else if constexpr (std::is_same_v<T, float>) {
          *p = static_cast<float>(scalar_as<double>(n, key, line, "a number"));
        } else if constexpr (std::is_same_v<T, int>) {
          *p = int_from(n, key, line);
        } else if constexpr (std::is_same_v<T, MicroBatch>) {
          *p = n.IsScalar() && n.Scalar() == "max" ? MicroBatch{p->size, true} : MicroBatch::fixed(int_from(n, key, line));
        } else if constexpr (std::is_same_v<T, EvalBatches>) {
          *p = n.IsScalar() && n.Scalar() == "all" ? EvalBatches{p->count, true} : EvalBatches::fixed(int_from(n, key, line));
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          *p = scalar_as<uint64_t>(n, key, line, "a non-negative integer");
        } else {
          *p = scalar_as<T>(n, key, line, "an integer");
        }
        }
      },
      f.ref);
}

std::string field_text(const Field& f) {
  if (const EnumRef* e = std::get_if<EnumRef>(&f.ref)) {
    YAML::Emitter out;
    out << YAML::DoubleQuoted << e->names[*e->value];  // as the string it was before it was an enum
    return out.c_str();
  }
  return std::visit(
      [&](auto p) -> std::string {
        if constexpr (std::is_same_v<decltype(p), EnumRef>) return "";  // printed above
        else {
        using T = std::remove_pointer_t<decltype(p)>;
        std::ostringstream os;
        if constexpr (std::is_same_v<T, std::string>) {
          YAML::Emitter e;
          e << YAML::DoubleQuoted << *p;
          return e.c_str();
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, float>) {
          return yaml_float(*p);  // the shortest text that reads back as this float: 3e-4 -> 0.0003
        } else if constexpr (std::is_same_v<T, MicroBatch>) {
          if (p->max) return "max";
          os << p->size;
        } else if constexpr (std::is_same_v<T, EvalBatches>) {
          if (p->all) return "all";
          os << p->count;
        } else {
          os << *p;
        }
        return os.str();
        }
      },
      f.ref);
}

std::string type_name(const Field& f) {
  if (const EnumRef* e = std::get_if<EnumRef>(&f.ref)) {
    std::string s;
    for (int i = 0; i < e->n; ++i) s += std::string(i ? " / " : "") + "`" + e->names[i] + "`";
    return s;
  }
  return std::visit(
      [](auto p) -> std::string {
        if constexpr (std::is_same_v<decltype(p), EnumRef>) return "";  // named above
        else {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) return "string";
        else if constexpr (std::is_same_v<T, bool>) return "bool";
        else if constexpr (std::is_same_v<T, float>) return "float";
        else if constexpr (std::is_same_v<T, MicroBatch>) return "int or `max`";
        else if constexpr (std::is_same_v<T, EvalBatches>) return "int or `all`";
        else return "int";
        }
      },
      f.ref);
}

}  // namespace gpt::config
