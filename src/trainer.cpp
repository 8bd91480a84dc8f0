#include "trainer.hpp"

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

#include "backend.hpp"
#include "checkpoint.hpp"
#include "config_io.hpp"
#include "modelfile.hpp"
#include "runlog.hpp"

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

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

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
      const uint64_t h1 = mix(seed ^ mix(base + t.offset + i)), h2 = mix(h1);
      const double u1 = (double(h1 >> 11) + 1.0) * 0x1.0p-53, u2 = double(h2 >> 11) * 0x1.0p-53;
      p[i] = float(s * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    }
  }
}

// "2.31 GB in 1.2 s (1.9 GB/s)" for the checkpoint of a step.
std::string dir_size_text(const std::string& run, int64_t step, double sec) {
  char name[32];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08lld", (long long)step);
  double bytes = 0;
  std::error_code ec;
  for (auto& f : std::filesystem::directory_iterator(run + name, ec)) bytes += double(f.file_size(ec));
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

// One run's live objects. Destroyed in reverse order: model, engine, communicator, backend.
struct Session {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<ParamLayout> layout;
  std::unique_ptr<ZeroEngine> engine;
  std::unique_ptr<GPT> model;
  MemoryBreakdown measured;
};

std::unique_ptr<Communicator> make_comm(const Plan& plan, HostComm& host, Backend& be) {
  if (plan.device == "cuda") return make_nccl_communicator(host, be);
  return make_mpi_communicator(host);
}

}  // namespace

RunResult train(const Config& cfg, HostComm& host, const PointInfo& point, bool resume_flag) {
  const int rank = host.rank(), world = host.world();
  const bool lead = rank == 0;
  Plan plan = make_plan(cfg, world);
  const std::string dir = run_dir(cfg);
  const bool resume = resume_flag || cfg.checkpoint.resume == "auto";
  Terminal term(lead, cfg.log.progress, cfg.training.steps);

  Session s;
  s.be = plan.device == "cuda" ? make_cuda_backend(cfg, host.local_rank()) : make_cpu_backend(cfg);
  s.comm = make_comm(plan, host, *s.be);
  s.layout = std::make_unique<ParamLayout>(plan.dims);
  const ParamLayout& layout = *s.layout;
  const auto& t = cfg.training;

  // State first (parameters, gradients, optimizer), then activations for the micro-batch.
  const size_t base_bytes = s.be->bytes_in_use();
  s.engine = std::make_unique<ZeroEngine>(layout, *s.be, *s.comm, host, t.zero_stage, t.master_weights);
  s.measured = s.engine->allocated();

  auto build_model = [&](int B) {
    s.model.reset();
    const size_t before = s.be->bytes_in_use();
    s.model = std::make_unique<GPT>(plan.dims, layout, *s.be, B, plan.seq_len, t.recompute);
    s.measured.activations = s.be->bytes_in_use() - before;
  };

  std::string status = "ok", message;
  int exit_code = kExitOk;
  std::unique_ptr<RunLog> log;
  Config resolved = cfg;  // with micro_batch: max replaced by the size found
  try {
    if (plan.micro_batch < 0) {
      // micro_batch: max. Try doubling sizes, then bisect, agreeing across ranks at every try. A size
      // fits when its predicted memory is within training.memory_limit_gb (if set) and, on a GPU, a
      // whole forward/backward at that size runs without running out of memory (within the limit).
      const double cap = double(t.memory_limit_gb) * double(1ull << 30);
      if (plan.device != "cuda" && cap <= 0)
        throw input_error("training.micro_batch: 'max' on the CPU needs training.memory_limit_gb (the search checks "
                          "the predicted memory against it)");
      auto fits = [&](int B) {
        Config cb = cfg;
        cb.training.micro_batch = B;
        if (cap > 0 && double(predict_memory(cb, make_plan(cb, world)).total()) > cap) return false;  // same on all ranks
        if (plan.device != "cuda") return true;
        int ok = 1;
        try {
          s.be->reset_peak();
          build_model(B);
          std::vector<int> tok(size_t(B) * plan.seq_len, 0);
          s.engine->begin_step();
          s.engine->begin_micro_step(true);
          s.model->forward(*s.engine, tok.data(), tok.data(), true, 0.0f);
          s.model->backward(*s.engine);
          s.engine->end_backward();
          s.be->synchronize();
          if (cap > 0 && double(s.be->peak_bytes()) > cap) ok = 0;
        } catch (const Error& e) {
          if (e.code() != kExitOutOfMemory) throw;
          ok = 0;
        }
        s.model.reset();
        return host.max(-long(ok)) == -1;  // fits only if it fits on every rank
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
        throw Error(kExitOutOfMemory, "training.micro_batch: max: not even micro-batch 1 fits (" + describe(cfg, world) + ")");
      resolved.training.micro_batch = lo;
      plan = make_plan(resolved, world);
      term.note("micro_batch: max -> " + std::to_string(lo));
    }
    build_model(plan.micro_batch);
    const int B = plan.micro_batch, T = plan.seq_len;
    MemoryBreakdown predicted = predict_memory(cfg, plan);

    // data
    std::unique_ptr<TokenSource> train_src, val_src;
    if (cfg.data.synthetic) {
      train_src = make_synthetic_source(cfg.data, cfg.run.seed, 0, B, T, rank, world);
      val_src = make_synthetic_source(cfg.data, cfg.run.seed, 1, B, T, rank, world);
    } else {
      train_src = make_shard_source(cfg.data.train, B, T, rank, world, plan.dims.vocab_size);
      if (!cfg.data.val.empty()) val_src = make_shard_source(cfg.data.val, B, T, rank, world, plan.dims.vocab_size);
    }

    // parameters: from a checkpoint, from an llm.c model file, or freshly initialised
    TrainState st;
    st.seed = cfg.run.seed;
    bool resumed = false;
    const auto r0 = std::chrono::steady_clock::now();
    if (resume) resumed = load_latest_checkpoint(dir, *s.engine, layout, host, st);
    if (resumed) {
      train_src->seek(st.data);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
      term.note("resumed from step " + std::to_string(st.step) + " of " + dir + ": " + dir_size_text(dir, st.step, sec));
    } else {
      std::vector<float> buf;
      std::vector<float> file_params;
      if (!cfg.model.init_from.empty()) file_params = read_model_file(cfg.model.init_from, layout);
      for (int b = 0; b < layout.n_buckets(); ++b) {
        if (!file_params.empty()) {
          const float* src = file_params.data() + layout.logical_offset(b);
          buf.assign(src, src + layout.bucket(b).size);
        } else {
          init_bucket(layout, b, cfg.run.seed, cfg.model.init_std, buf);
        }
        s.engine->set_bucket_params(b, buf.data());
      }
    }
    st.config_yaml = config_to_yaml(resolved);

    if (lead) {
      std::filesystem::create_directories(dir);
      RunInfo info;
      info.name = cfg.run.name;
      info.config_yaml = st.config_yaml;
      info.device = plan.device;
      info.hardware = s.be->hardware() + " x" + std::to_string(world);
      info.git_rev = GIT_REV;
      info.point_values = point.values;
      info.point_index = point.index;
      info.n_params = int64_t(plan.n_params);
      info.tokens_per_step = plan.tokens_per_step;
      info.world_size = world;
      info.zero_stage = t.zero_stage;
      info.flops_per_token = plan.flops_per_token;
      info.peak_flops = s.be->peak_flops();
      log = std::make_unique<RunLog>(dir + "/log.h5", info, predicted, resumed ? st.step : -1);
      term.note("train data: " + train_src->describe() + (val_src ? "; val data: " + val_src->describe() : ""));
    }

    auto evaluate = [&]() {
      if (!val_src || cfg.eval.batches == 0) return double(NAN);
      std::vector<int> tok(size_t(B) * T), tgt(size_t(B) * T);
      val_src->seek(DataPosition{});
      double sum = 0;
      for (int i = 0; i < cfg.eval.batches; ++i) {
        val_src->next(tok.data(), tgt.data());
        sum += s.model->forward(*s.engine, tok.data(), tgt.data(), false, 0.0f);
      }
      return host.sum(sum / cfg.eval.batches) / world;
    };

    std::vector<int> tok(size_t(B) * T), tgt(size_t(B) * T);
    const float dloss = 1.0f / (float(B) * T * plan.grad_accum * world);
    const double peak = s.be->peak_flops() * world;
    double ema_ms = 0;
    int timed = 0;
    s.be->reset_peak();
    for (int step = int(st.step); step < t.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const double lr = lr_at(t, step);
      s.engine->begin_step();
      double loss = 0;
      for (int micro = 0; micro < plan.grad_accum; ++micro) {
        train_src->next(tok.data(), tgt.data());
        s.engine->begin_micro_step(micro + 1 == plan.grad_accum);
        loss += s.model->forward(*s.engine, tok.data(), tgt.data(), true, dloss);
        s.model->backward(*s.engine);
      }
      s.engine->end_backward();
      loss = host.sum(loss / plan.grad_accum) / world;
      const double norm = s.engine->grad_norm();
      if (!std::isfinite(loss) || !std::isfinite(norm))
        throw Error(kExitFailure, "training diverged at step " + std::to_string(step + 1) + ": loss " +
                                      std::to_string(loss) + ", gradient norm " + std::to_string(norm));
      const float scale = clip_scale(norm, t.grad_clip);
      s.engine->update({float(lr), t.beta1, t.beta2, t.eps, t.weight_decay, scale, step + 1,
                        mix(cfg.run.seed + uint64_t(step))});
      s.be->synchronize();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      st.step = step + 1;
      st.data = train_src->position();
      // timing: skip the first step of a process (warm-up) in the ETA average
      if (timed++ > 0) ema_ms = ema_ms == 0 ? ms : 0.9 * ema_ms + 0.1 * ms;
      const double tps = plan.tokens_per_step / (ms / 1000.0);
      const bool last = st.step == t.steps;
      if (lead && (st.step % cfg.log.every == 0 || last || st.step == 1)) {
        TrainRow row{st.step, loss, lr, norm, ms, tps, peak > 0 ? plan.flops_per_token * tps / peak : NAN};
        log->train_row(row);
        term.step_line(row, int(st.step), (t.steps - st.step) * (ema_ms > 0 ? ema_ms : ms) / 1000.0);
      }
      if ((cfg.eval.every > 0 && st.step % cfg.eval.every == 0) || last) {
        const double vl = evaluate();
        if (lead && !std::isnan(vl)) {
          log->eval_row(st.step, vl);
          term.note("step " + std::to_string(st.step) + " | val loss " + std::to_string(vl));
        }
      }
      const bool stop = host.max(stop_requested() ? 1 : 0) > 0;
      if ((cfg.checkpoint.every > 0 && st.step % cfg.checkpoint.every == 0) || (stop && !last)) {
        const auto c0 = std::chrono::steady_clock::now();
        save_checkpoint(dir, st, *s.engine, layout, host, cfg.checkpoint.keep_last);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
        if (lead) term.note("checkpoint written at step " + std::to_string(st.step) + ": " + dir_size_text(dir, st.step, sec));
      }
      if (stop && !last) {
        status = "checkpointed";
        message = "stopped by a signal at step " + std::to_string(st.step) + "; resume with --resume";
        exit_code = kExitCheckpointed;
        term.note(message);
        break;
      }
    }
  } catch (const Error& e) {
    // The run's own failure: recorded, then reported to the caller. All ranks reach this together
    // for errors that depend on the config; others end the job through the caller's abort.
    status = e.code() == kExitOutOfMemory ? "oom" : "failed";
    message = e.what();
    if (e.code() == kExitOutOfMemory && message.find("(model ") == std::string::npos)
      message = "out of memory for this config (" + describe(resolved, world) + "): " + message;
    exit_code = e.code();
  }
  s.be->synchronize();
  s.measured.activations = s.model ? s.measured.activations : 0;
  const size_t peak_bytes = s.be->peak_bytes();
  if (log) log->finish(status, message, s.measured, peak_bytes);
  if (lead && status != "ok" && status != "checkpointed") std::cerr << "error: " << message << "\n";
  (void)base_bytes;
  return {status, message, exit_code};
}

}  // namespace gpt
