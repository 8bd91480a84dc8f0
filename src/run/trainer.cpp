#include "run/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "config/config_io.hpp"
#include "io/checkpoint.hpp"
#include "io/data.hpp"
#include "io/modelfile.hpp"
#include "io/runlog.hpp"
#include "model/gpt.hpp"
#include "model/init.hpp"
#include "run/eval.hpp"
#include "run/max_batch.hpp"
#include "run/schedule.hpp"
#include "run/signals.hpp"
#include "run/stack.hpp"
#include "run/terminal.hpp"

#ifndef GIT_REV
#define GIT_REV "unknown"
#endif

namespace gpt {

namespace {

// "2.31 GB in 1.2 s (1.9 GB/s)" for the checkpoint of a step.
std::string dir_size_text(const std::string& run, int64_t step, double sec) {
  double bytes = 0;
  std::error_code ec;
  for (auto& f : std::filesystem::directory_iterator(checkpoint_dir(run, step), ec)) bytes += double(f.file_size(ec));
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.3f GB in %.2f s (%.2f GB/s)", bytes / 1e9, sec, sec > 0 ? bytes / 1e9 / sec : 0.0);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One run: set up, then the loop. Members are destroyed in reverse order (the model before the stack
// that owns its memory).
class Trainer {
 public:
  Trainer(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume)
      : cfg_(cfg), t_(cfg.training), resolved_(cfg), host_(host), point_(point), world_(host.world()),
        lead_(host.rank() == 0), resume_(resume || cfg.checkpoint.resume == "auto"), dir_(run_dir(cfg)),
        plan_(plan), term_(lead_, cfg.log.progress, cfg.training.steps) {}

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
        message_ = "out of memory for this config (" + describe(plan_) + "): " + message_;
      exit_code_ = e.code();
    }
    if (stack_.backend) stack_.backend->synchronize();
    if (log_) log_->finish(status_, message_, measured_, stack_.backend ? stack_.backend->peak_bytes() : 0);
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
      // state first (parameters, gradients, optimizer), then activations for the micro-batch
      stack_ = build_stack(plan_, host_);
      be_ = stack_.backend.get();
      engine_ = stack_.engine.get();
      layout_ = stack_.layout.get();
      be_->op_profile_pause(true);  // set-up is not profiled; train_step turns the profile on
      measured_ = engine_->allocated();
    });
    if (plan_.micro_batch_max) {
      const double cap = double(t_.memory_limit_gb) * double(1ull << 30);
      const int B = find_max_micro_batch(plan_, cap, host_, [&](int b) { return runs_at(b, cap); });
      resolved_.training.micro_batch = MicroBatch::fixed(B);
      plan_ = with_micro_batch(plan_, B);
      term_.note("micro_batch: max -> " + std::to_string(B));
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

  // micro_batch: max on a GPU: whether a whole forward/backward at micro-batch B runs (within cap).
  bool runs_at(int B, double cap) {
    bool ok = true;
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
      if (cap > 0 && double(be_->peak_bytes()) > cap) ok = false;
    } catch (const Error& e) {
      if (e.code() != kExitOutOfMemory) throw;
      ok = false;
    }
    model_.reset();
    return ok;
  }

  void build_model(int B) {
    model_.reset();
    model_ = std::make_unique<GPT>(plan_.dims, *layout_, *be_, B, plan_.seq_len, plan_.recompute);
    measured_.activations = model_->stored_bytes();
    measured_.workspace = model_->scratch_bytes();
  }

  void open_data() {
    const int B = plan_.micro_batch, T = plan_.seq_len, r = host_.rank();
    tok_.resize(size_t(B) * T);
    tgt_.resize(size_t(B) * T);
    if (cfg_.data.synthetic)
      train_src_ = make_synthetic_source(cfg_.data, cfg_.run.seed, 0, B, T, r, world_);
    else
      train_src_ = make_shard_source(cfg_.data.train, B, T, r, world_, plan_.dims.vocab_size,
                                     ShardOrder{cfg_.data.shuffle, cfg_.run.seed});
    eval_ = std::make_unique<Evaluator>(cfg_, plan_, host_);
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
    info.zero_stage = plan_.zero.stage;
    info.flops_per_token = plan_.flops_per_token;
    info.peak_flops = be_->peak_flops();
    log_ = std::make_unique<RunLog>(dir_ + "/log.h5", info, predict_memory(plan_), resumed_ ? st_.step : -1);
    const std::string evals = eval_->describe();
    term_.note("train data: " + train_src_->describe() + (evals.empty() ? "" : "; " + evals));
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
        const EvalRow e = eval_->run(*model_, *engine_, st_.step);
        if (lead_ && !e.empty()) {
          log_->eval_row(e);
          term_.note(eval_text(e));
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

  Stack stack_;
  Backend* be_ = nullptr;          // stack_'s, named for the loop
  ZeroEngine* engine_ = nullptr;
  const ParamLayout* layout_ = nullptr;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<TokenSource> train_src_;
  std::unique_ptr<Evaluator> eval_;
  std::unique_ptr<RunLog> log_;
  std::vector<int> tok_, tgt_;

  TrainState st_;
  bool resumed_ = false;
  MemoryBreakdown measured_;
  std::string status_ = "ok", message_;
  int exit_code_ = kExitOk;
};

}  // namespace

RunResult train(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume) {
  return Trainer(cfg, plan, host, point, resume).run();
}

}  // namespace gpt
