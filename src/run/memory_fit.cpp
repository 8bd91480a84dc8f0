#include "run/memory_fit.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "base/format.hpp"
#include "config/config_io.hpp"
#include "io/checkpoint.hpp"
#include "optim/optimizer.hpp"
#include "optim/state.hpp"

namespace gpt {

namespace {

constexpr const char* kStates[] = {"fp32", "bf16", "int8"};  // most precise first

int state_rank(const std::string& s) {
  for (int i = 0; i < 3; ++i)
    if (s == kStates[i]) return i;
  return 0;
}
int master_rank(MasterWeights m) {
  for (size_t i = 0; i < std::size(kMasterOptions); ++i)
    if (m == kMasterOptions[i]) return int(i);
  return 0;
}

bool given(const Config& cfg, const char* key) { return cfg.set_keys.count(key) > 0; }
// The micro-batch and accumulation as the config gave them (else chosen).
bool split_given(const Config& cfg) {
  return given(cfg, "training.micro_batch") ||
         (given(cfg, "training.grad_accum") && cfg.training.total_batch_tokens == 0);
}

// The bytes per rank the combinations' predicted allocations must fit.
double fit_budget(const Config& cfg, const Plan& plan, std::string& text) {
  const float limit = cfg.training.memory_limit_gb;
  const std::string runtime = plan.device == "cuda" ? ", less " + format_bytes(kCudaRuntimeBytes) +
                                                          " for the CUDA context and libraries" : "";
  if (limit > 0) {
    const double b = double(limit) * double(1ull << 30);
    text = "training.memory_limit_gb " + yaml_float(limit) + " (" + format_bytes(b) + " per rank" + runtime + ")";
    return allocation_budget(b, plan.device);
  }
  if (plan.device == "cpu")
    throw input_error("config error: training.memory_limit_gb: training.memory_fit: auto on the CPU needs it > 0 "
                      "(the budget per rank the combinations' predicted memory must fit)");
  if (plan.caps.memory == 0)
    throw input_error("config error: training.memory_limit_gb: training.memory_fit: auto needs it > 0 here (no "
                      "CUDA device here to take the budget from)");
  text = "the GPU's memory, " + format_bytes(double(plan.caps.memory)) + " (training.memory_limit_gb is 0" + runtime + ")";
  return allocation_budget(double(plan.caps.memory), plan.device);
}

// "params 1.00 MiB, grads 1.00 MiB, ..." (the components the prediction has)
std::string components(const MemoryBreakdown& m) {
  std::string s;
  for (const MemoryComponent& c : kMemoryComponents)
    if (m.*c.bytes) s += (s.empty() ? "" : ", ") + std::string(c.name) + " " + format_bytes(double(m.*c.bytes));
  return s;
}

std::string line(const char* what, const FitCandidate& k) {
  char t[48];
  std::snprintf(t, sizeof t, "%.4g ms", k.step_s * 1e3);
  return std::string(what) + k.describe() + ": " + format_bytes(double(k.memory.total())) + " (" +
         components(k.memory) + "), " + t + " a step";
}

// --resume: the keys the config does not give take the values of the newest checkpoint whose config reads
// (the one the resume continues from, unless its tensors turn out damaged), and are kept as given; ""
// when there is none (the run starts from scratch, and chooses).
std::string keep_checkpoint_choice(Config& cfg) {
  if (cfg.checkpoint.resume != ResumeMode::automatic) return "";
  for (const std::string& ck : list_checkpoints(run_dir(cfg))) {
    Config old;
    try {
      old = config_from_yaml(read_checkpoint_config(ck), "the config of '" + ck + "'");
    } catch (const Error&) {
      continue;  // the resume names it, or falls back past it
    }
    TrainingConfig& t = cfg.training;
    const TrainingConfig& o = old.training;
    if (!given(cfg, "training.optimizer_state")) t.optimizer_state = o.optimizer_state;
    if (!given(cfg, "training.recompute")) t.recompute = o.recompute;
    if (!given(cfg, "training.master_weights")) t.master_weights = o.master_weights;
    if (!given(cfg, "training.offload")) t.offload = o.offload;
    if (!given(cfg, "training.gradient_release")) t.gradient_release = o.gradient_release;
    if (!given(cfg, "training.logits_chunk")) t.logits_chunk = o.logits_chunk;
    if (!split_given(cfg)) {
      t.micro_batch = o.micro_batch;
      if (t.total_batch_tokens == 0) t.grad_accum = o.grad_accum;
    }
    for (const char* k : {"training.optimizer_state", "training.recompute", "training.master_weights",
                          "training.offload", "training.gradient_release", "training.logits_chunk",
                          "training.micro_batch", "training.grad_accum"})
      cfg.set_keys.insert(k);
    return ck;
  }
  return "";
}

}  // namespace

double allocation_budget(double budget, const std::string& device) {
  if (budget <= 0 || device != "cuda") return budget;
  return std::max(1.0, budget - kCudaRuntimeBytes);  // a budget the runtime alone exceeds fits nothing
}

double predicted_step_s(const Plan& p, double host_s_per_param) {
  // the products at FP8's rate in the share of the block products' weights that run in FP8
  // (training.fp8_layers, fp8_products)
  const double f8 = p.model.precision.fp8_weight_share(p.model.dims.n_layer);
  const double products = f8 == 0   ? p.flops_per_token / kRate
                          : f8 == 1 ? p.flops_per_token / kRateFp8
                                    : p.flops_per_token * (f8 / kRateFp8 + (1 - f8) / kRate);
  const double token = products + kActBytes * p.model.dims.n_layer * p.model.dims.n_embd / kHbm;
  const double micro = kMicroBytes * double(p.n_params) / kHbm;
  const MemoryBreakdown m = predict_memory(p);
  const double n = double(p.n_params) / (p.zero.shard_optimizer ? p.world : 1);  // the parameters this rank updates
  const double code = p.zero.state == optim::StateType::Int8 ? kInt8CodeCost : 1.0;
  // the gradient read, the parameter written, and read unless an fp32 master replaces it
  // (offloaded, the fp32 master is in host memory: not in the device's prediction, still what is read)
  const double passes = p.master_weights == optim::MasterKind::F32 && (m.master > 0 || p.zero.offload) ? 2 : 3;
  double update = (2 * (double(m.master) + code * double(m.optim)) + passes * dtype_size(p.act) * n) / kHbm;
  if (p.zero.offload && p.device != "cpu") {  // the state is in host memory: the host's pass and PCIe
    const double t = host_s_per_param > 0 ? host_s_per_param : kHostSecondsPerParam[int(p.zero.state)];
    update = t * n + 2 * dtype_size(p.act) * n / kPcie;
  }
  return p.grad_accum * (double(p.micro_batch) * p.seq_len * token * (1 + kRecomputeExtra[p.recompute]) + micro) +
         update;
}

std::string FitCandidate::describe() const {
  return "optimizer_state " + optimizer_state + ", recompute " + std::to_string(recompute) + ", master_weights " +
         name_of(master) + (offload == Offload::optimizer ? ", offload optimizer" : "") +
         (gradient_release ? ", gradient_release" : "") +
         (logits_chunk > 0 ? ", logits_chunk " + std::to_string(logits_chunk) : "") + ", micro_batch " +
         std::to_string(micro_batch) + " x grad_accum " + std::to_string(grad_accum);
}

FitResult rank_fits(const Config& cfg, int world, bool dry_run) {
  const TrainingConfig& t = cfg.training;
  const Plan base = make_plan(cfg, world, dry_run);  // the config as given, validated
  FitResult r;
  r.budget = fit_budget(cfg, base, r.budget_text);
  std::vector<std::string> states(std::begin(kStates), std::end(kStates));
  std::vector<int> levels = {0, 1, 2, 3};
  std::vector<MasterWeights> masters(std::begin(kMasterOptions), std::end(kMasterOptions));
  if (given(cfg, "training.optimizer_state")) states = {t.optimizer_state};
  if (given(cfg, "training.recompute")) levels = {t.recompute};
  if (given(cfg, "training.master_weights") || t.master_weights == MasterWeights::none || base.act == DType::F32)
    masters = {t.master_weights};
  std::vector<Offload> offloads = {Offload::none, Offload::optimizer};
  if (given(cfg, "training.offload") || base.device == "cpu" || base.zero.stage == 3) offloads = {t.offload};
  const int per_rank = int(base.tokens_per_step / (int64_t(base.seq_len) * world));  // sequences a step
  std::vector<int> micro;
  if (split_given(cfg)) {
    micro = {base.micro_batch};
  } else {
    for (int B = per_rank; B >= 1; --B)
      if (per_rank % B == 0) micro.push_back(B);
  }
  // gradient release where the config allows it and leaves it open: grad_clip 0 (and then one micro-batch
  // a step, no offload: below)
  std::vector<bool> releases = {t.gradient_release};
  if (!given(cfg, "training.gradient_release") && t.grad_clip == 0) releases = {false, true};
  for (const char* k : {"training.optimizer_state", "training.recompute", "training.master_weights", "training.offload",
                        "training.gradient_release", "training.logits_chunk"})
    if (given(cfg, k)) r.kept.push_back(k);
  if (split_given(cfg))
    r.kept.push_back(given(cfg, "training.micro_batch") ? "training.micro_batch" : "training.grad_accum");

  // training.offload's host update, measured on this machine once per state type and master kind (a run on
  // a GPU), where an offloaded combination fits; a dry run takes the model's constant
  const bool measure_host = !dry_run && base.device == "cuda";
  std::map<std::pair<optim::StateType, optim::MasterKind>, double> host_s;
  auto host_rate = [&](const Plan& p, MasterWeights master) {
    const auto key = std::make_pair(p.zero.state, p.master_weights);
    auto it = host_s.find(key);
    if (it != host_s.end()) return it->second;
    const auto opt = make_optimizer(p.optimizer, p.stochastic_rounding, p.zero.state, p.hypers);
    const double s = host_update_s_per_param(*opt, p.master_weights, kHostProbeParams);
    char ns[32];
    std::snprintf(ns, sizeof ns, "%.3g", s * 1e9);
    r.host_text += std::string(r.host_text.empty() ? "" : ", ") + optim::state_type_name(p.zero.state) +
                   " state (master " + name_of(master) + ") " + ns + " ns";
    return host_s[key] = s;
  };
  bool offload_fits = false;

  std::vector<int> chunks = {t.logits_chunk};  // the config's, and the smaller one where it leaves the key
  if (!given(cfg, "training.logits_chunk") && t.logits_chunk != kFitLogitsChunk) chunks.push_back(kFitLogitsChunk);

  for (bool release : releases)
  for (Offload off : offloads)
  for (MasterWeights mo : masters)
    for (const std::string& state : states)
      for (int level : levels) {
        // gradient release: the whole step's sequences in one micro-batch (if the config leaves the split
        // open), no offload
        if (release && (off == Offload::optimizer ||
                        std::find(micro.begin(), micro.end(), per_rank) == micro.end()))
          continue;
        Config c = cfg;
        c.training.optimizer_state = state;
        c.training.recompute = level;
        c.training.master_weights = mo;
        c.training.offload = off;
        c.training.gradient_release = release;
        if (release) {
          c.training.micro_batch = MicroBatch::fixed(per_rank);
          if (t.total_batch_tokens == 0) c.training.grad_accum = 1;
        }
        const Plan p0 = make_plan(c, world, dry_run);
        for (int B : micro)
          for (int chunk : chunks) {
            if (chunk != t.logits_chunk && int64_t(B) * base.seq_len <= chunk)
              continue;  // the added chunk only where the micro-batch holds more rows
            if (release && B != per_rank) continue;
            Plan p = p0;
            p.grad_accum = per_rank / B;
            p.logits_chunk = logits_chunk_rows(chunk);
            p = with_micro_batch(p, B);
            FitCandidate k{state, level, mo, off, release, B, p.grad_accum, chunk, predict_memory(p), 0};
            const bool fits = double(k.memory.total()) <= r.budget;
            const bool offloaded = off == Offload::optimizer && p.zero.offload;
            k.step_s = predicted_step_s(p, offloaded && fits && measure_host ? host_rate(p, mo) : 0);
            offload_fits |= offloaded && fits;
            if (r.considered++ == 0 || k.memory.total() < r.smallest.memory.total()) r.smallest = k;
            if (fits) r.fitting.push_back(k);
          }
      }
  if (offload_fits)
    r.host_text = measure_host ? "offload's host update measured here, a parameter: " + r.host_text
                               : "offload's host update: kHostSecondsPerParam, measured on an H100 machine (a dry run; a "
                                 "run measures this host's)";
  if (r.fitting.empty()) return r;
  double fastest = r.fitting.front().step_s;
  for (const FitCandidate& k : r.fitting) fastest = std::min(fastest, k.step_s);
  // within the band of the fastest: the most precise state, then master, then the fastest; the rest by time;
  // at equal predicted time, the one without gradient release (which costs no time in the model: chosen
  // where it lets another combination fit), then the one that leaves more of the budget (the CUDA
  // runtime's share varies: the whole process measured 1.1-1.9 GiB above the allocations)
  auto key = [&](const FitCandidate& k) {
    const bool band = k.step_s <= fastest * (1 + kPrecisionBand);
    return std::make_tuple(band ? 0 : 1, band ? state_rank(k.optimizer_state) : 0, band ? master_rank(k.master) : 0,
                           k.step_s, k.gradient_release, k.memory.total());
  };
  std::stable_sort(r.fitting.begin(), r.fitting.end(),
                   [&](const FitCandidate& a, const FitCandidate& b) { return key(a) < key(b); });
  return r;
}

Plan plan_with_fit(Config& cfg, int world, bool dry_run) {
  if (cfg.training.memory_fit != MemoryFit::automatic) return make_plan(cfg, world, dry_run);
  Config c = cfg;
  const std::string ck = keep_checkpoint_choice(c);
  const FitResult r = rank_fits(c, world, dry_run);
  if (r.fitting.empty())
    throw Error(kExitOutOfMemory, "training.memory_fit: auto: no combination fits " + r.budget_text +
                                      ": the smallest predicted total is " +
                                      format_bytes(double(r.smallest.memory.total())) + ", with " +
                                      r.smallest.describe() + " (" + std::to_string(r.considered) +
                                      " combination(s) predicted)");
  const FitCandidate& k = r.fitting.front();
  TrainingConfig& t = c.training;
  t.optimizer_state = k.optimizer_state;
  t.recompute = k.recompute;
  t.master_weights = k.master;
  t.offload = k.offload;
  t.gradient_release = k.gradient_release;
  t.logits_chunk = k.logits_chunk;
  t.micro_batch = MicroBatch::fixed(k.micro_batch);
  if (t.total_batch_tokens == 0) t.grad_accum = k.grad_accum;
  Plan plan = make_plan(c, world, dry_run);
  std::string kept;
  for (const std::string& key : r.kept) kept += (kept.empty() ? "" : ", ") + key;
  plan.memory_fit = "memory_fit: auto: " + std::to_string(r.fitting.size()) + " of " + std::to_string(r.considered) +
                    " combination(s) fit " + r.budget_text +
                    (ck.empty() ? kept.empty() ? "" : "; kept as given: " + kept
                                : "; --resume keeps the combination of '" + ck + "'") +
                    "\n" + line("chosen:    ", k) + "\n" +
                    (r.fitting.size() > 1 ? line("runner-up: ", r.fitting[1])
                                          : r.considered > 1 ? "runner-up: none (no other combination fits)"
                                                             : "runner-up: none (the only combination)") +
                    (r.host_text.empty() ? "" : "\n" + r.host_text) +
                    "\n(predicted step time: the H100 model of src/run/memory_fit.hpp, for ranking)";
  cfg.training = t;
  return plan;
}

}  // namespace gpt
