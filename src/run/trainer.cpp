#include "run/trainer.hpp"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "backend/backend.hpp"
#include "io/checkpoint.hpp"
#include "config/config_io.hpp"
#include "io/modelfile.hpp"
#include "io/runlog.hpp"

#ifndef GIT_REV
#define GIT_REV "unknown"
#endif

namespace gpt {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;  // the one process-wide flag a signal handler may set
void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_signals() {
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}
bool stop_requested() { return g_stop_signal != 0; }

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

static std::string resolve_device(const std::string& d) {
  if (d == "cpu") return "cpu";
  if (d == "cuda") {
    if (cuda_device_count() == 0)
      throw input_error("training.device: cuda was asked for but no CUDA device is usable here");
    return "cuda";
  }
  return cuda_device_count() > 0 ? "cuda" : "cpu";
}

Plan make_plan(const Config& cfg, int world) {
  validate(cfg, world);
  Plan p;
  p.dims = resolve_dims(cfg.model);
  p.device = resolve_device(cfg.training.device);
  p.act = (p.device == "cuda" && cfg.training.precision == "bf16") ? DType::BF16 : DType::F32;
  p.world = world;
  p.micro_batch = cfg.training.micro_batch;
  p.seq_len = cfg.training.seq_len;
  p.grad_accum = cfg.training.grad_accum;
  if (cfg.training.total_batch_tokens > 0 && p.micro_batch > 0)
    p.grad_accum = int(cfg.training.total_batch_tokens / (int64_t(p.micro_batch) * p.seq_len * world));
  p.tokens_per_step = int64_t(std::max(p.micro_batch, 0)) * p.seq_len * p.grad_accum * world;
  ParamLayout layout(p.dims);
  p.n_params = layout.n_params();
  p.backend.act = p.act;
  p.backend.stochastic_rounding = cfg.training.stochastic_rounding;
  p.backend.deterministic = cfg.training.deterministic;
  p.backend.matmul_search_s = cfg.training.matmul_search_s;
  p.backend.op_profile = cfg.log.op_profile;
  p.flops_per_token = 6.0 * double(p.n_params) + 6.0 * p.dims.n_layer * p.dims.n_embd * double(p.seq_len);
  return p;
}

MemoryBreakdown predict_memory(const Config& cfg, const Plan& plan) {
  ParamLayout layout(plan.dims);
  MemoryBreakdown m = predict_state_bytes(layout, plan.world, cfg.training.zero_stage, plan.act,
                                          cfg.training.master_weights);
  if (plan.micro_batch > 0) {
    ActivationBytes a = activation_bytes(plan.dims, plan.micro_batch, plan.seq_len, cfg.training.recompute, plan.act);
    m.activations = a.stored;
    m.workspace = a.scratch;
  }
  if (plan.device == "cuda") m.workspace += size_t(32) << 20;  // cuBLASLt workspace
  return m;
}

double lr_at(const TrainingConfig& t, int step) {
  const double max_lr = t.lr, min_lr = t.lr * double(t.min_lr_frac);
  if (step < t.warmup_steps) return max_lr * (step + 1) / t.warmup_steps;
  const int decay_steps = t.steps - t.warmup_steps;
  const double p = decay_steps > 1 ? double(step - t.warmup_steps) / (decay_steps - 1) : 1.0;
  if (t.schedule == "constant") return max_lr;
  if (t.schedule == "linear") return max_lr - (max_lr - min_lr) * p;
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

float clip_scale(double norm, float clip) { return (clip > 0 && norm > clip) ? float(clip / norm) : 1.0f; }

void print_plan(const Config& cfg, const Plan& plan, const MemoryBreakdown& mem) {
  std::ostringstream os;
  os << "+-- config " << std::string(58, '-') << "\n";
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
  char buf[640];
  os << "+-- derived " << std::string(57, '-') << "\n";
  std::snprintf(buf, sizeof buf,
                "| model              %d layers x %d heads x %d wide, vocab %d (padded %d)\n"
                "| parameters         %zu\n"
                "| device             %s (%s), world size %d, ZeRO stage %d\n"
                "| batch              micro %d x seq %d x accum %d x ranks %d = %lld tokens/step\n"
                "| FLOPs per token    %.3g\n",
                plan.dims.n_layer, plan.dims.n_head, plan.dims.n_embd, plan.dims.vocab_size, plan.dims.padded_vocab,
                plan.n_params, plan.device.c_str(), dtype_name(plan.act), plan.world, cfg.training.zero_stage,
                plan.micro_batch, plan.seq_len, plan.grad_accum, plan.world, (long long)plan.tokens_per_step,
                plan.flops_per_token);
  os << buf;
  os << "+-- predicted memory per rank " << std::string(39, '-') << "\n";
  const std::pair<const char*, size_t> rows[] = {
      {"params", mem.params},   {"grads", mem.grads},         {"master", mem.master},       {"adam_m", mem.adam_m},
      {"adam_v", mem.adam_v},   {"activations", mem.activations}, {"workspace", mem.workspace}, {"comm", mem.comm},
      {"total", mem.total()}};
  for (auto& [k, v] : rows) {
    std::snprintf(buf, sizeof buf, "| %-18s %12s\n", k, format_bytes(double(v)).c_str());
    os << buf;
  }
  if (plan.micro_batch < 0) os << "| (activations: micro_batch is 'max', found at start)\n";
  os << "+" << std::string(69, '-') << "\n";
  std::cout << os.str() << std::flush;
}

// ---------------------------------------------------------------------------------------------------
namespace {

// GPT-2 initialisation, a pure function of (seed, logical index): the same on any world size.
void init_bucket(const ParamLayout& layout, int b, uint64_t seed, float std, std::vector<float>& out) {
  const Bucket& bk = layout.bucket(b);
  const ModelDims& d = layout.dims();
  out.assign(bk.size, 0.0f);
  const size_t base = layout.logical_offset(b);
  for (const TensorInfo& t : bk.tensors) {
    float* p = out.data() + t.offset;
    if (t.id == P::ln1w || t.id == P::ln2w || t.id == P::lnfw) {
      std::fill(p, p + t.numel, 1.0f);
      continue;
    }
    if (t.shape.size() != 2) continue;  // biases stay zero
    float s = std;
    if (t.id == P::attprojw || t.id == P::fcprojw) s = std / std::sqrt(2.0f * d.n_layer);
    size_t n = t.numel;
    if (t.id == P::wte) n = size_t(d.vocab_size) * d.n_embd;  // padded rows stay zero
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h1 = splitmix64(seed ^ splitmix64(base + t.offset + i)), h2 = splitmix64(h1);
      const double u1 = (double(h1 >> 11) + 1.0) * 0x1.0p-53, u2 = double(h2 >> 11) * 0x1.0p-53;
      p[i] = float(s * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  }
}

// "2.31 GB in 1.2 s (1.9 GB/s)" for the checkpoint of a step.
std::string dir_size_text(const std::string& run, int64_t step, double sec) {
  double bytes = 0;
  std::error_code ec;
  for (auto& f : std::filesystem::directory_iterator(checkpoint_dir(run, step), ec)) bytes += double(f.file_size(ec));
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.3f GB in %.2f s (%.2f GB/s)", bytes / 1e9, sec, sec > 0 ? bytes / 1e9 / sec : 0.0);
  return buf;
}

// "model 48x1600, micro_batch 16 x seq 1024, ZeRO stage 0, recompute 0, 2 rank(s)" for messages.
std::string describe(const Config& c, int world) {
  const ModelDims d = resolve_dims(c.model);
  char buf[200];
  std::snprintf(buf, sizeof buf, "model %dx%d, micro_batch %d x seq %d, ZeRO stage %d, recompute %d, %d rank(s)",
                d.n_layer, d.n_embd, c.training.micro_batch, c.training.seq_len, c.training.zero_stage,
                c.training.recompute, world);
  return buf;
}

class Terminal {
 public:
  Terminal(bool on, bool progress, int steps) : on_(on), tty_(on && progress && isatty(1)), steps_(steps) {}
  void step_line(const TrainRow& r, int steps_done, double eta_s) {
    if (!on_) return;
    clear_bar();
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "step %6lld/%d | loss %.4f | lr %.2e | norm %.3f | %8.1f ms | %9.0f tok/s%s | ETA %s\n",
                  (long long)r.step, steps_, r.loss, r.lr, r.grad_norm, r.step_ms, r.tokens_per_s,
                  std::isnan(r.mfu) ? "" : (" | MFU " + fmt_pct(r.mfu)).c_str(), fmt_time(eta_s).c_str());
    std::cout << buf << std::flush;
    bar(steps_done, eta_s);
  }
  void note(const std::string& s) {
    if (!on_) return;
    clear_bar();
    std::cout << s << "\n" << std::flush;
  }
  void bar(int done, double eta_s) {
    if (!tty_) return;
    const int w = 40, fill = steps_ ? int(double(done) / steps_ * w) : w;
    std::cout << "\r[" << std::string(fill, '#') << std::string(w - fill, '.') << "] " << done << "/" << steps_
              << "  ETA " << fmt_time(eta_s) << std::flush;
    bar_shown_ = true;
  }
  void clear_bar() {
    if (bar_shown_) std::cout << "\r" << std::string(72, ' ') << "\r";
    bar_shown_ = false;
  }
  static std::string fmt_time(double s) {
    if (!(s >= 0) || !std::isfinite(s)) return "?";
    char buf[32];
    const long t = long(s + 0.5);
    if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
    return buf;
  }
  static std::string fmt_pct(double x) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
    return buf;
  }

 private:
  bool on_, tty_;
  int steps_;
  bool bar_shown_ = false;
};

std::unique_ptr<Communicator> make_comm(const Plan& plan, HostComm& host, Backend& be) {
  if (plan.device == "cuda") return make_nccl_communicator(host, be);
  return make_mpi_communicator(host);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One run: set up, then the loop. Members are destroyed in reverse order (model and engine before
// the communicator and the backend that own their memory).
class Trainer {
 public:
  Trainer(const Config& cfg, HostComm& host, const PointInfo& point, bool resume)
      : cfg_(cfg), t_(cfg.training), resolved_(cfg), host_(host), point_(point), world_(host.world()),
        lead_(host.rank() == 0), resume_(resume || cfg.checkpoint.resume == "auto"), dir_(run_dir(cfg)),
        plan_(make_plan(cfg, host.world())), term_(lead_, cfg.log.progress, cfg.training.steps) {}

  RunResult run() {
    try {
      setup();
      loop();
    } catch (const Error& e) {
      // The run's own failure (a config value, out of memory, divergence): recorded and returned.
      // Set-up phases agree across ranks first (agreed()), so every rank gets here together.
      status_ = e.code() == kExitOutOfMemory ? "oom" : "failed";
      message_ = e.what();
      if (e.code() == kExitOutOfMemory && message_.find("(model ") == std::string::npos)
        message_ = "out of memory for this config (" + describe(resolved_, world_) + "): " + message_;
      exit_code_ = e.code();
    }
    if (be_) be_->synchronize();
    if (log_) log_->finish(status_, message_, measured_, be_ ? be_->peak_bytes() : 0);
    if (lead_ && status_ != "ok" && status_ != "checkpointed") std::cerr << "error: " << message_ << "\n";
    return {status_, message_, exit_code_};
  }

 private:
  // Runs one set-up phase on every rank, then agrees: if it failed anywhere, it fails everywhere (with
  // the local message, or the worst status another rank reported), so no rank walks on alone.
  template <class Fn>
  void agreed(const char* phase, Fn fn) {
    std::string err;
    long code = 0;
    try {
      fn();
    } catch (const Error& e) {
      err = e.what();
      code = e.code();
    }
    const long worst = host_.max(code);
    if (worst == 0) return;
    throw Error(ExitCode(err.empty() ? worst : code),
                err.empty() ? std::string(phase) + " failed on another rank" : err);
  }

  void setup() {
    std::string times;  // where set-up time goes, printed once: start-up matters for sweeps of big models
    auto timed = [&](const char* phase, auto fn) {
      const auto t0 = std::chrono::steady_clock::now();
      agreed(phase, fn);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s %.1f s", times.empty() ? "" : ", ", phase, seconds_since(t0));
      times += buf;
    };
    timed("allocation", [&] {
      BackendOptions bo = plan_.backend;
      bo.local_rank = host_.local_rank();
      be_ = plan_.device == "cuda" ? make_cuda_backend(bo) : make_cpu_backend(bo);
      comm_ = make_comm(plan_, host_, *be_);
      be_->op_profile_pause(true);  // set-up is not profiled; train_step turns the profile on
      layout_ = std::make_unique<ParamLayout>(plan_.dims);
      // state first (parameters, gradients, optimizer), then activations for the micro-batch
      engine_ = std::make_unique<ZeroEngine>(*layout_, *be_, *comm_, host_, t_.zero_stage, t_.master_weights);
      measured_ = engine_->allocated();
    });
    if (plan_.micro_batch < 0) {
      resolved_.training.micro_batch = find_max_micro_batch();
      plan_ = make_plan(resolved_, world_);
      term_.note("micro_batch: max -> " + std::to_string(plan_.micro_batch));
    }
    timed("activations", [&] { build_model(plan_.micro_batch); });
    timed("data", [&] { open_data(); });
    st_.seed = cfg_.run.seed;
    st_.config_yaml = config_to_yaml(resolved_);
    if (resume_) {
      const auto t0 = std::chrono::steady_clock::now();
      resumed_ = load_latest_checkpoint(dir_, *engine_, *layout_, host_, st_);  // agrees internally
      if (resumed_) {
        train_src_->seek(st_.data);
        term_.note("resumed from step " + std::to_string(st_.step) + " of " + dir_ + ": " +
                   dir_size_text(dir_, st_.step, seconds_since(t0)));
      }
      st_.config_yaml = config_to_yaml(resolved_);
    }
    if (!resumed_) timed("initialisation", [&] { init_params(); });
    timed("run log", [&] { open_log(); });
    term_.note("set-up: " + times);
  }

  // micro_batch: max. Doubling sizes, then bisection. A size fits when its predicted memory is within
  // training.memory_limit_gb (if set) and, on a GPU, a whole forward/backward at that size runs
  // without running out of memory (and within the limit). Every try is agreed across ranks.
  int find_max_micro_batch() {
    const double cap = double(t_.memory_limit_gb) * double(1ull << 30);
    if (plan_.device != "cuda" && cap <= 0)
      throw input_error("training.micro_batch: 'max' on the CPU needs training.memory_limit_gb (the search checks "
                        "the predicted memory against it)");
    auto fits = [&](int B) {
      Config cb = cfg_;
      cb.training.micro_batch = B;
      if (cap > 0 && double(predict_memory(cb, make_plan(cb, world_)).total()) > cap) return false;  // same everywhere
      if (plan_.device != "cuda") return true;
      int ok = 1;
      try {
        be_->reset_peak();
        build_model(B);
        std::vector<int> tok(size_t(B) * plan_.seq_len, 0);
        engine_->begin_step();
        engine_->begin_micro_step(true);
        model_->forward(*engine_, tok.data(), tok.data(), true, 0.0f);
        model_->backward(*engine_);
        engine_->end_backward();
        be_->synchronize();
        if (cap > 0 && double(be_->peak_bytes()) > cap) ok = 0;
      } catch (const Error& e) {
        if (e.code() != kExitOutOfMemory) throw;
        ok = 0;
      }
      model_.reset();
      return host_.max(-long(ok)) == -1;  // fits only if it fits on every rank
    };
    int lo = 0, hi = 1;
    while (hi <= 65536 && fits(hi)) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    if (lo == 0)
      throw Error(kExitOutOfMemory, "training.micro_batch: max: not even micro-batch 1 fits (" + describe(cfg_, world_) + ")");
    return lo;
  }

  void build_model(int B) {
    model_.reset();
    model_ = std::make_unique<GPT>(plan_.dims, *layout_, *be_, B, plan_.seq_len, t_.recompute);
    measured_.activations = model_->stored_bytes();
    measured_.workspace = model_->scratch_bytes();
  }

  void open_data() {
    const int B = plan_.micro_batch, T = plan_.seq_len, r = host_.rank();
    tok_.resize(size_t(B) * T);
    tgt_.resize(size_t(B) * T);
    if (cfg_.data.synthetic) {
      train_src_ = make_synthetic_source(cfg_.data, cfg_.run.seed, 0, B, T, r, world_);
      val_src_ = make_synthetic_source(cfg_.data, cfg_.run.seed, 1, B, T, r, world_);
    } else {
      train_src_ = make_shard_source(cfg_.data.train, B, T, r, world_, plan_.dims.vocab_size);
      if (!cfg_.data.val.empty()) val_src_ = make_shard_source(cfg_.data.val, B, T, r, world_, plan_.dims.vocab_size);
    }
  }

  // Parameters from an llm.c model file, or GPT-2's initialisation.
  void init_params() {
    std::vector<float> buf, file_params;
    if (!cfg_.model.init_from.empty()) file_params = read_model_file(cfg_.model.init_from, *layout_);
    for (int b = 0; b < layout_->n_buckets(); ++b) {
      if (!file_params.empty()) {
        const float* src = file_params.data() + layout_->logical_offset(b);
        buf.assign(src, src + layout_->bucket(b).size);
      } else {
        init_bucket(*layout_, b, cfg_.run.seed, cfg_.model.init_std, buf);
      }
      engine_->set_bucket_params(b, buf.data());
    }
  }

  void open_log() {
    if (!lead_) return;
    std::filesystem::create_directories(dir_);
    RunInfo info;
    info.name = cfg_.run.name;
    info.config_yaml = st_.config_yaml;
    info.device = plan_.device;
    info.hardware = be_->hardware() + " x" + std::to_string(world_);
    info.git_rev = GIT_REV;
    info.point_values = point_.values;
    info.point_index = point_.index;
    info.n_params = int64_t(plan_.n_params);
    info.tokens_per_step = plan_.tokens_per_step;
    info.world_size = world_;
    info.zero_stage = t_.zero_stage;
    info.flops_per_token = plan_.flops_per_token;
    info.peak_flops = be_->peak_flops();
    log_ = std::make_unique<RunLog>(dir_ + "/log.h5", info, predict_memory(resolved_, plan_), resumed_ ? st_.step : -1);
    term_.note("train data: " + train_src_->describe() + (val_src_ ? "; val data: " + val_src_->describe() : ""));
  }

  struct StepResult {
    double loss, norm, lr;
  };

  // One optimizer step: grad_accum micro-steps of forward and backward, gradients reduced as the
  // engine's stage says, the global norm, clipping, AdamW.
  StepResult train_step(int step) {
    const int N = plan_.micro_batch * plan_.seq_len;
    const float dloss = 1.0f / (float(N) * plan_.grad_accum * world_);  // mean over every token of the step
    StepResult r{0, 0, lr_at(t_, step)};
    be_->op_profile_pause(false);  // the op profile covers training steps only, not evaluation or checkpoints
    engine_->begin_step();
    for (int micro = 0; micro < plan_.grad_accum; ++micro) {
      train_src_->next(tok_.data(), tgt_.data());
      engine_->begin_micro_step(micro + 1 == plan_.grad_accum);
      r.loss += model_->forward(*engine_, tok_.data(), tgt_.data(), true, dloss);
      model_->backward(*engine_);
    }
    engine_->end_backward();
    r.loss = host_.sum(r.loss / plan_.grad_accum) / world_;
    r.norm = engine_->grad_norm();
    if (!std::isfinite(r.loss) || !std::isfinite(r.norm))
      throw Error(kExitFailure, "training diverged at step " + std::to_string(step + 1) + ": loss " +
                                    std::to_string(r.loss) + ", gradient norm " + std::to_string(r.norm));
    engine_->update({float(r.lr), t_.beta1, t_.beta2, t_.eps, t_.weight_decay, clip_scale(r.norm, t_.grad_clip),
                     step + 1, splitmix64(cfg_.run.seed + uint64_t(step))});
    be_->synchronize();
    be_->op_profile_pause(true);
    return r;
  }

  double evaluate() {
    if (!val_src_ || cfg_.eval.batches == 0) return NAN;
    val_src_->seek(DataPosition{});  // the same batches every time
    double sum = 0;
    for (int i = 0; i < cfg_.eval.batches; ++i) {
      val_src_->next(tok_.data(), tgt_.data());
      sum += model_->forward(*engine_, tok_.data(), tgt_.data(), false, 0.0f);
    }
    return host_.sum(sum / cfg_.eval.batches) / world_;
  }

  void checkpoint() {
    const auto t0 = std::chrono::steady_clock::now();
    save_checkpoint(dir_, st_, *engine_, *layout_, host_, cfg_.checkpoint.keep_last);
    term_.note("checkpoint written at step " + std::to_string(st_.step) + ": " +
               (lead_ ? dir_size_text(dir_, st_.step, seconds_since(t0)) : std::string()));
  }

  void loop() {
    const double peak = be_->peak_flops() * world_;
    double avg_ms = 0;
    int timed = 0;
    const size_t set_up_bytes = be_->bytes_in_use();
    be_->reset_peak();
    for (int step = int(st_.step); step < t_.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult r = train_step(step);
      const double ms = 1000.0 * seconds_since(t0);
      st_.step = step + 1;
      st_.data = train_src_->position();
      const bool last = st_.step == t_.steps;
      if (timed++ == 0) {
        // what the libraries took on first use (cuBLASLt/cuDNN workspaces, kernel scratch) is workspace too
        measured_.workspace = model_->scratch_bytes() + (be_->bytes_in_use() - set_up_bytes);
        avg_ms = ms;  // the ETA's first guess; the warm-up step is left out of the average after this
        be_->op_profile_reset();
      } else {
        avg_ms = timed == 2 ? ms : 0.9 * avg_ms + 0.1 * ms;
      }
      const double tps = plan_.tokens_per_step / (ms / 1000.0);
      if (lead_ && (st_.step % cfg_.log.every == 0 || last || st_.step == 1)) {
        const TrainRow row{st_.step, r.loss, r.lr, r.norm, ms, tps, peak > 0 ? plan_.flops_per_token * tps / peak : NAN};
        log_->train_row(row);
        term_.step_line(row, int(st_.step), (t_.steps - st_.step) * avg_ms / 1000.0);
      }
      if ((cfg_.eval.every > 0 && st_.step % cfg_.eval.every == 0) || last) {
        const double vl = evaluate();
        if (lead_ && !std::isnan(vl)) {
          log_->eval_row(st_.step, vl);
          term_.note("step " + std::to_string(st_.step) + " | val loss " + std::to_string(vl));
        }
      }
      const bool stop = host_.max(stop_requested() ? 1 : 0) > 0;  // every rank stops at the same step
      if ((cfg_.checkpoint.every > 0 && st_.step % cfg_.checkpoint.every == 0) || (stop && !last)) checkpoint();
      if (stop && !last) {
        status_ = "checkpointed";
        message_ = "stopped by a signal at step " + std::to_string(st_.step) + "; resume with --resume";
        exit_code_ = kExitCheckpointed;
        term_.note(message_);
        return;
      }
    }
    if (lead_ && cfg_.log.op_profile && !be_->op_profile().empty()) term_.note(be_->op_profile());
  }

  const Config& cfg_;
  const TrainingConfig& t_;
  Config resolved_;  // micro_batch: max replaced by the size found
  HostComm& host_;
  const PointInfo point_;
  const int world_;
  const bool lead_, resume_;
  const std::string dir_;
  Plan plan_;
  Terminal term_;

  std::unique_ptr<Backend> be_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<ZeroEngine> engine_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<TokenSource> train_src_, val_src_;
  std::unique_ptr<RunLog> log_;
  std::vector<int> tok_, tgt_;

  TrainState st_;
  bool resumed_ = false;
  MemoryBreakdown measured_;
  std::string status_ = "ok", message_;
  int exit_code_ = kExitOk;
};

}  // namespace

RunResult train(const Config& cfg, HostComm& host, const PointInfo& point, bool resume) {
  return Trainer(cfg, host, point, resume).run();
}

}  // namespace gpt
