#include "run/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "config/config_io.hpp"
#include "parallel/agree.hpp"
#include "parallel/zero.hpp"
#include "optim/optimizer.hpp"
#include "io/checkpoint.hpp"
#include "model/gpt.hpp"

namespace gpt {

namespace {
// The device a run of this config uses. A dry run plans for the configured device without needing it
// (device: cuda plans as cuda on a login node), and says what device: auto was taken to mean.
std::string resolve_device(Device d, bool dry_run, std::string& note) {
  if (d == Device::cpu) return "cpu";
  const bool gpu_here = cuda_device_count() > 0;
  if (d == Device::cuda) {
    if (!gpu_here && !dry_run)
      throw input_error("training.device: cuda was asked for but no CUDA device is usable here");
    if (!gpu_here) note = "planned for cuda; no CUDA device here, so nothing was checked against one";
    return "cuda";
  }
  if (dry_run)
    note = gpu_here ? "device: auto -> cuda (a CUDA device is here)"
                    : "device: auto -> cpu (no CUDA device here); set training.device: cuda to plan for a GPU";
  return gpu_here ? "cuda" : "cpu";
}
}  // namespace

// The config against what the device can do, before anything is built (a dry run on the node does it too).
void check_capabilities(const Config& cfg, Plan& p) {
  const DeviceCaps& c = p.caps;
  if (cfg.training.precision == Precision::fp8 && !c.fp8) {
    if (c.name.empty()) {  // planned for a GPU that is not here
      p.device_note += std::string(p.device_note.empty() ? "" : "; ") +
                       "training.precision fp8 needs FP8 tensor cores (compute capability 8.9 or later), not checked";
      return;
    }
    char cc[16];
    std::snprintf(cc, sizeof cc, "%d.%d", c.compute_capability / 10, c.compute_capability % 10);
    throw input_error("config error: training.precision: fp8 needs FP8 tensor cores (a GPU of compute capability "
                      "8.9 or later: Ada, Hopper) or the CPU's emulation (training.device: cpu); this node's " +
                      c.name + " is " + cc);
  }
}

PrecisionPolicy precision_policy(const TrainingConfig& t, int n_layer) {
  PrecisionPolicy p;
  if (t.precision == Precision::fp8) {
    // every layer: no mask (the same policy as before the key); none: no FP8 block product at all
    std::vector<bool> layers = parse_layer_set(t.fp8_layers, n_layer, "training.fp8_layers");
    p.fp8_linear = std::find(layers.begin(), layers.end(), true) != layers.end();
    if (p.fp8_linear && std::find(layers.begin(), layers.end(), false) != layers.end()) p.fp8_layer = std::move(layers);
    p.fp8_products = parse_product_set(t.fp8_products, "training.fp8_products");
  }
  p.fp8_classifier = t.precision == Precision::fp8 && t.fp8_classifier;
  p.fp8_gelu_epilogue = t.fp8_gelu_epilogue;
  return p;
}

Plan make_plan(const Config& cfg, int world, bool dry_run) {
  validate(cfg, world);
  const TrainingConfig& t = cfg.training;
  Plan p;
  p.model.dims = resolve_dims(cfg.model);
  p.device = resolve_device(t.device, dry_run, p.device_note);
  p.caps = p.device == "cpu" ? cpu_device_caps() : cuda_device_caps(0);
  check_capabilities(cfg, p);
  p.act = (p.device == "cuda" && t.precision != Precision::fp32) ? DType::BF16 : DType::F32;
  p.model.precision = precision_policy(t, p.model.dims.n_layer);
  p.fp8_recipe.grad = t.fp8_grad_format;
  p.fp8_recipe.history = t.fp8_amax_history;
  p.fp8_recipe.margin = t.fp8_margin;
  p.optimizer = t.optimizer;
  p.hypers = t.hypers;
  p.optimizer_slots = int(find_optimizer(t.optimizer)->slots.size());
  p.stochastic_rounding = t.stochastic_rounding;
  p.world = world;
  p.micro_batch_max = t.micro_batch.max;
  p.seq_len = t.seq_len;
  p.grad_accum = t.grad_accum;
  const ParamLayout layout(p.model.dims);
  p.n_params = layout.n_params();
  p.flops_per_token = flops_per_token(layout, p.seq_len);
  p.zero = ZeroPolicy::of_stage(t.zero_stage);
  // FP8 gathers carry a layer's four product weights as bytes: with some products in bf16 the layers gather whole
  p.zero.gather_fp8 = p.zero.shard_params && p.model.precision.fp8_linear && t.fp8_weight_gather &&
                      p.model.precision.fp8_products == kAllBlockProducts;
  // recompute 3: one layer's FP8 weight copies for all, cast again in each block's backward, unless ZeRO-3
  // gathers the weights as FP8 (the backward would gather them again)
  p.model.precision.fp8_weights_kept = p.zero.gather_fp8;
  optim::parse_state_type(t.optimizer_state, p.zero.state);  // validated
  p.zero.offload = t.offload == Offload::optimizer;
  p.zero.release_grads = t.gradient_release;
  p.master_weights = t.master_weights == MasterWeights::fp32          ? optim::MasterKind::F32
                     : t.master_weights == MasterWeights::compensated ? optim::MasterKind::Compensated
                                                                      : optim::MasterKind::None;
  p.recompute = t.recompute;
  p.logits_chunk = logits_chunk_rows(t.logits_chunk);
  p.checkpoints = cfg.checkpoint.every > 0;
  p.backend.act = p.act;
  p.backend.deterministic = t.deterministic;
  p.backend.fp8_fast_accum = t.fp8_fast_accum;
  p.backend.matmul_search_s = t.matmul_search_s;
  p.backend.op_profile = cfg.log.op_profile;
  p.shared_gpu = cfg.parallel.shared_gpu == SharedGpu::host;
  if (t.micro_batch.max) return p;
  p = with_micro_batch(p, t.micro_batch.size);
  if (t.total_batch_tokens > 0) {
    p.grad_accum = int(t.total_batch_tokens / (int64_t(p.micro_batch) * p.seq_len * world));
    p.tokens_per_step = int64_t(p.micro_batch) * p.seq_len * p.grad_accum * world;
  }
  return p;
}

Plan with_micro_batch(Plan p, int micro_batch) {
  p.micro_batch = micro_batch;
  p.tokens_per_step = int64_t(micro_batch) * p.seq_len * p.grad_accum * p.world;
  return p;
}

size_t host_snapshot_bytes(const Plan& plan) {
  return snapshot_bytes(ParamLayout(plan.model.dims), plan.world, plan.zero,
                        EngineSizes::has_master(plan.act, plan.master_weights), plan.optimizer_slots);
}

MemoryBreakdown predict_memory(const Plan& plan) {
  ParamLayout layout(plan.model.dims);
  MemoryBreakdown m =
      engine_sizes(layout, plan.world, plan.zero).bytes(plan.act, plan.master_weights, plan.optimizer_slots);
  if (plan.micro_batch > 0) {
    ActivationBytes a =
        activation_bytes(plan.model, plan.micro_batch, plan.seq_len, plan.recompute, plan.act, plan.logits_chunk);
    m.activations = a.stored;
    m.workspace = a.scratch;
  }
  // the CUDA backend's own memory (backend/backend.hpp) and the FP8 scaling state: with them the peak the
  // backend allocated was 268 bytes above the prediction at every point of GPT-2 1558M's frontier, 668
  // with gradient release (the engine's flags and per-bucket sums, uncounted; bench/RESULTS.md,
  // 2026-12-07). On the CPU the prediction is the model's own buffers.
  if (plan.device == "cuda") {
    m.workspace += kCublasWorkspaceBytes + kCudaScratchStep;
    if (plan.micro_batch > 0)
      m.workspace += cudnn_attention_bytes(size_t(plan.micro_batch) * plan.seq_len, plan.model.dims.n_embd, plan.model.dims.n_head);
    if (plan.model.precision.any_fp8())
      m.workspace += Fp8Scaling::state_bytes(fp8_scaled_tensors(plan.model), plan.fp8_recipe.history);
  }
  // CPU: the snapshot is taken by the first checkpoint, which without checkpoint.every only a stop signal
  // makes (GPU: it is host memory, not the device's)
  if (plan.device == "cpu" && plan.checkpoints) m.snapshot = host_snapshot_bytes(plan);
  // training.offload: host memory; on the CPU that is the device's (GPU: host_offload_bytes, apart)
  if (plan.device == "cpu") m.offload = host_offload_bytes(plan);
  return m;
}

size_t host_offload_bytes(const Plan& plan) {
  return engine_sizes(ParamLayout(plan.model.dims), plan.world, plan.zero)
      .host_bytes(plan.act, plan.master_weights, plan.optimizer_slots);
}

namespace {
// MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping), or 0 when unknown.
double available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}
}  // namespace

void check_host_memory(const Plan& plan, HostComm& host, bool checkpoints) {
  agreed(host, "the host memory check", [&] {
    // GPU: the snapshot is the host memory a run takes (page-locked at the start of a run that checkpoints),
    // and the offloaded optimizer's (training.offload)
    const size_t offload = host_offload_bytes(plan);
    if (plan.device != "cpu" && !checkpoints && offload == 0) return;
    const bool cpu = plan.device == "cpu";
    const double avail = available_host_bytes(),
                 need = double(cpu ? predict_memory(plan).total() : (checkpoints ? host_snapshot_bytes(plan) : 0) + offload) *
                        host.local_size();
    const std::string state = "training.offload's optimizer state, " + format_bytes(double(offload)) + " (" +
                              std::to_string(offload) + " B) per rank";
    std::string what;
    if (!cpu)
      what = std::string(" of page-locked host memory for ") + (checkpoints ? "its checkpoint snapshots" : "") +
             (checkpoints && offload > 0 ? " and " : "") + (offload > 0 ? state : "");
    else if (offload > 0)
      what = " with " + state;
    if (avail > 0 && need > avail)
      throw Error(kExitOutOfMemory, "out of host memory: " + describe(plan) + " needs " + format_bytes(need) + what +
                                        " (predicted, for " + std::to_string(host.local_size()) +
                                        " rank(s) on this node) and " + format_bytes(avail) + " is available");
  });
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

std::string describe(const Plan& p) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "model %dx%d, micro_batch %d x seq %d, ZeRO stage %d, recompute %d, %d rank(s)",
                p.model.dims.n_layer, p.model.dims.n_embd, p.micro_batch, p.seq_len, p.zero.stage, p.recompute, p.world);
  return buf;
}

namespace {
// "m, v: 2 fp32 values per parameter" (int8: "..., and an fp32 scale per 256 of each")
std::string optimizer_state_text(const std::string& name, optim::StateType type) {
  std::string s;
  for (const std::string& slot : find_optimizer(name)->slots) s += (s.empty() ? "" : ", ") + slot;
  const size_t n = find_optimizer(name)->slots.size();
  s += ": " + std::to_string(n) + " " + optim::state_type_name(type) + " value" + (n == 1 ? "" : "s") + " per parameter";
  if (type == optim::StateType::Int8) s += ", and an fp32 scale per " + std::to_string(optim::kQuantBlock) + " of each";
  return s;
}

// "| training.lr                    0.000600000028" rows from the config's YAML
void print_config_rows(std::ostringstream& os, const Config& cfg) {
  std::istringstream yaml(config_to_yaml(cfg));
  std::string line, section;
  while (std::getline(yaml, line)) {
    if (line.empty()) continue;
    if (line[0] != ' ') {
      section = line.substr(0, line.size() - 1);
      continue;
    }
    auto colon = line.find(':');
    std::string key = section + "." + line.substr(2, colon - 2);
    char buf[160];
    std::snprintf(buf, sizeof buf, "| %-30s %s\n", key.c_str(), line.substr(colon + 2).c_str());
    os << buf;
  }
}
}  // namespace

void print_plan(const Config& cfg, const Plan& plan) {
  std::ostringstream os;
  os << "+-- config " << std::string(58, '-') << "\n";
  print_config_rows(os, cfg);
  for (const std::string& n : cfg.notes) os << "| (" << n << ")\n";
  char buf[640];
  os << "+-- derived " << std::string(57, '-') << "\n";
  std::snprintf(buf, sizeof buf,
                "| model              %d layers x %d heads x %d wide, vocab %d (padded %d), %s\n"
                "| parameters         %zu\n"
                "| device             %s (%s), world size %d, ZeRO stage %d\n"
                "| batch              micro %d x seq %d x accum %d x ranks %d = %lld tokens/step\n"
                "| FLOPs per token    %.3g\n"
                "| optimizer          %s (state: %s)\n",
                plan.model.dims.n_layer, plan.model.dims.n_head, plan.model.dims.n_embd, plan.model.dims.vocab_size, plan.model.dims.padded_vocab,
                structure_text(plan.model.dims).c_str(), plan.n_params, plan.device.c_str(), plan.model.precision.any_fp8() ? (plan.act == DType::BF16 ? "bf16, fp8 products" : "fp32, fp8 products emulated") : dtype_name(plan.act), plan.world, plan.zero.stage,
                plan.micro_batch, plan.seq_len, plan.grad_accum, plan.world,
                (long long)plan.tokens_per_step, plan.flops_per_token, plan.optimizer.c_str(),
                optimizer_state_text(plan.optimizer, plan.zero.state).c_str());
  os << buf;
  if (plan.act == DType::BF16) {
    const optim::MasterKind m = plan.master_weights;
    os << "| master weights     "
       << (m == optim::MasterKind::F32           ? "fp32 copy of the bf16 parameters"
           : m == optim::MasterKind::Compensated ? "compensated: a bf16 residual beside each bf16 parameter"
                                                 : "none: the bf16 parameters are updated in place")
       << "\n";
  }
  if (!plan.model.precision.fp8_layer.empty()) {  // some layers' products in bf16 (training.fp8_layers)
    std::string layers[2];  // bf16, fp8
    for (int l = 0; l < plan.model.dims.n_layer; ++l) {
      std::string& s = layers[plan.model.precision.layer_fp8(l)];
      s += (s.empty() ? "" : " ") + std::to_string(l);
    }
    os << "| fp8 layers         " << layers[1] << " (bf16: " << layers[0] << ")\n";
  }
  if (plan.model.precision.fp8_linear && plan.model.precision.fp8_products != kAllBlockProducts) {  // training.fp8_products
    std::string products[2];  // bf16, fp8
    for (int q = 0; q < 4; ++q) {
      std::string& s = products[plan.model.precision.fp8_products >> q & 1u];
      s += (s.empty() ? "" : " ") + std::string(kBlockProducts[q]);
    }
    os << "| fp8 products       " << products[1] << " (bf16: " << products[0] << ")\n";
  }
  if (!plan.device_note.empty()) os << "| (" << plan.device_note << ")\n";
  if (!plan.memory_fit.empty()) {
    os << "+-- memory fit " << std::string(55, '-') << "\n";
    std::istringstream fit(plan.memory_fit);
    for (std::string l; std::getline(fit, l);) os << "| " << l << "\n";
  }
  os << "+-- predicted memory per rank " << std::string(39, '-') << "\n";
  const MemoryBreakdown mem = predict_memory(plan);
  auto row = [&](const char* name, size_t bytes) {
    std::snprintf(buf, sizeof buf, "| %-18s %12s %16zu B\n", name, format_bytes(double(bytes)).c_str(), bytes);
    os << buf;
  };
  for (const MemoryComponent& c : kMemoryComponents) row(c.name, mem.*c.bytes);
  row("total", mem.total());
  if (plan.micro_batch_max)
    os << (plan.micro_batch > 0 ? "| (micro_batch: max -> the largest size predicted to fit; a GPU run also tries it)\n"
                                : "| (activations: micro_batch is 'max', found at start)\n");
  if (plan.device != "cpu" && cfg.checkpoint.every > 0)  // the host memory a run takes only when it checkpoints
    os << "| (checkpoint snapshot: " << format_bytes(double(host_snapshot_bytes(plan)))
       << " of page-locked host memory per rank, taken at the start: checkpoint.every > 0)\n";
  if (plan.zero.offload)  // GPU: not the device's memory; CPU: the offload row above
    os << "| (offloaded to host: " << format_bytes(double(host_offload_bytes(plan)))
       << " per rank: master weights, optimizer state and transfer buffers, training.offload)\n";
  if (plan.device == "cpu" && cfg.checkpoint.every == 0)  // not in the total: no checkpoint unless a signal asks
    os << "| (checkpoint snapshot: " << format_bytes(double(host_snapshot_bytes(plan)))
       << " more per rank if a stop signal makes a checkpoint: checkpoint.every is 0)\n";
  os << "+" << std::string(69, '-') << "\n";
  std::cout << os.str() << std::flush;
}

}  // namespace gpt
