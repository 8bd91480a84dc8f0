#include "run/trainer.hpp"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "config/config_io.hpp"
#include "parallel/agree.hpp"
#include "io/checkpoint.hpp"
#include "io/csv_log.hpp"
#include "io/data.hpp"
#include "io/modelfile.hpp"
#include "io/run_dir.hpp"
#include "io/runlog.hpp"
#include "model/gpt.hpp"
#include "model/init.hpp"
#include "run/checkpointing.hpp"
#include "run/eval.hpp"
#include "run/faults.hpp"
#include "run/max_batch.hpp"
#include "run/resume.hpp"
#include "run/schedule.hpp"
#include "run/signals.hpp"
#include "run/stack.hpp"
#include "run/terminal.hpp"

#ifndef GIT_REV
#define GIT_REV "unknown"
#endif

namespace gpt {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds since the kernel started this process (loading the libraries and the device's start counted),
// from /proc/self/stat's start time on the boot clock; -1 where that cannot be read.
double process_age_s() {
  std::ifstream in("/proc/self/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');  // the command name may hold spaces: fields count from after it
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  for (int i = 3; i < 22 && fields >> f;) ++i;  // fields 3-21
  unsigned long long ticks = 0;
  timespec now{};
  if (!(fields >> ticks) || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec) - double(ticks) / double(sysconf(_SC_CLK_TCK));
}

// Divergence (every rank sees it: the loss and norm are all-reduced, the state check is agreed): exit 2,
// the message naming the last good checkpoint, which is the newest (a non-finite state is never written)
// once the one in flight has been published (Checkpointing::salvage): so it is named only then.
class Diverged : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// One run: set up, then the loop. Members are destroyed in reverse order (the model before the stack
// that owns its memory).
class Trainer {
 public:
  Trainer(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume)
      : cfg_(cfg), t_(cfg.training), resolved_(cfg), host_(host), point_(point), world_(host.world()),
        lead_(host.rank() == 0), resume_(resume || cfg.checkpoint.resume == ResumeMode::automatic), dir_(run_dir(cfg)),
        plan_(plan), term_(lead_, cfg.log.progress, cfg.training.steps), faults_(host.rank()),
        ckpt_(cfg.checkpoint, dir_, host, term_, plan.device != "cpu") {}

  // Failures that every rank agrees on (AgreedError: set-up phases, data, log writes, divergence,
  // checkpoints) end the run on every rank together: recorded and returned. Any other failure (in the
  // step's compute and collectives) may be this rank's alone while the others wait in a collective for
  // it: on several ranks it ends the whole job at once (end_job).
  //
  // No failure that every rank agreed on discards finished work: the checkpoint being written in the
  // background is published before the run ends when its write completes (salvage). A failure of one
  // rank among several ends the job at once, and that write with it (its .tmp folder stays, ignored).
  RunResult run() {
    try {
      setup();
      if (earlier_.complete_at < 0) loop();
    } catch (const Diverged& e) {
      record(e);
      salvage();
      const auto ck = list_checkpoints(dir_);
      message_ += "; the last good checkpoint is " +
                  (ck.empty() ? std::string("none (no checkpoint was written)") : ck.front());
    } catch (const AgreedError& e) {
      record(e);
      salvage();
    } catch (const Error& e) {
      if (world_ > 1) end_job(e);
      record(e);
      salvage();  // one rank: nobody else to wait for
    } catch (const std::exception& e) {
      if (world_ > 1) end_job(Error(kExitFailure, std::string("internal error: ") + e.what()));
      throw;
    }
    if (stack_.backend) {
      try {
        stack_.backend->synchronize();
      } catch (const Error& e) {
        if (status_ == "ok") record(e);
      }
    }
    const bool logged = log_ != nullptr;
    finish_log();
    if (lead_ && status_ != "ok" && status_ != "checkpointed") std::cerr << "error: " << message_ << "\n";
    const std::string last_ckpt = lead_ ? latest_checkpoint(dir_) : std::string();
    if (earlier_.complete_at >= 0) {
      message_ = "already complete at step " + std::to_string(earlier_.complete_at);
      term_.summary(status_, dir_ + "/log.h5", last_ckpt, earlier_.complete_at);
    } else if (logged) {
      // a resumed run whose checkpoint is its last step trains nothing: it was complete too
      const int64_t complete = resumed_ && resumed_at_ == t_.steps ? resumed_at_ : -1;
      term_.summary(status_, dir_ + "/log.h5", last_ckpt, status_ == "ok" ? complete : -1);
    }
    return {status_, message_, exit_code_, term_.totals()};
  }

 private:
  void record(const Error& e) {
    status_ = e.code() == kExitOutOfMemory ? "oom" : "failed";
    message_ = e.what();
    if (e.code() == kExitOutOfMemory && message_.find("(model ") == std::string::npos)
      message_ = "out of memory for this config (" + describe(plan_) + "): " + message_;
    exit_code_ = e.code();
  }

  // The outcome goes into the log; a log that cannot take it (a full disk) is reported, not fatal.
  void finish_log() {
    if (!log_) return;
    if (status_ == "ok" && !ckpt_.errors().empty()) message_ = "checkpoints failed: " + ckpt_.errors();
    try {
      log_->finish(status_, message_, measured_, stack_.backend ? stack_.backend->peak_bytes() : 0,
                   stack_.backend ? stack_.backend->baseline_bytes() : 0);
    } catch (const Error& e) {
      std::cerr << "error: could not record the outcome in " << dir_ << "/log.h5: " << e.what() << "\n";
      if (exit_code_ == kExitOk) record(e);
    }
    sinks_.clear();
    csv_.reset();
    log_.reset();
  }

  template <class Fn>
  void agreed(const char* phase, Fn&& fn) {
    gpt::agreed(host_, phase, std::forward<Fn>(fn));
  }

  // The checkpoint in flight after a failure: published when its write completes (every rank is here).
  void salvage() {
    const std::string lost = ckpt_.salvage();
    if (!lost.empty()) message_ += "; " + lost;
  }

  void end_job(const Error& e) {  // does not return: HostComm::abort ends the process
    std::cerr << "[rank " << host_.rank() << "] error: " << e.what() << "; ending every rank\n" << std::flush;
    record(e);
    finish_log();
    host_.abort(e.code());
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
    timed("run directory", [&] { take_run_dir(); });
    share_data_files();
    // --resume of a run that completed, asked for no more steps: nothing to do, nothing touched
    earlier_.complete_at = host_.max(lead_ ? long(earlier_.complete_at) : -1L);
    if (earlier_.complete_at >= 0) return;
    timed("allocation", [&] {
      // state first (parameters, gradients, optimizer), then activations for the micro-batch
      stack_ = build_stack(plan_, host_);
      be_ = stack_.backend.get();
      engine_ = stack_.engine.get();
      layout_ = stack_.layout.get();
      be_->op_profile_pause(true);  // set-up is not profiled; train_step turns the profile on
      measured_ = engine_->allocated();
      if (plan_.precision.any_fp8()) fp8_ = std::make_unique<Fp8Scaling>(*be_, plan_.fp8_recipe);
    });
    if (plan_.micro_batch_max) {
      const double cap = double(t_.memory_limit_gb) * double(1ull << 30);
      const int B = find_max_micro_batch(plan_, cap, host_, [&](int b) { return runs_at(b, cap); });
      resolved_.training.micro_batch = MicroBatch::fixed(B);
      plan_ = with_micro_batch(plan_, B);
      term_.note("micro_batch: max -> " + std::to_string(B));
    }
    timed("activations", [&] { build_model(plan_.micro_batch); });
    timed("data", [&] {
      faults_.at("setup", 0);
      open_data();
    });
    st_.seed = cfg_.run.seed;
    st_.config_yaml = config_to_yaml(resolved_);
    st_.data_files = data_files_;
    if (resume_) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto accept = [&](const TrainState& old) {
        const std::string warning =
            check_resumable(resolved_, plan_, old, data_files_, "the checkpoint of step " + std::to_string(old.step));
        if (lead_ && !warning.empty()) std::cerr << warning << "\n";
      };
      resumed_ = load_latest_checkpoint(dir_, *engine_, *layout_, host_, st_, accept, cfg_.checkpoint.threads);
      if (resumed_ && fp8_ && !st_.fp8.empty())
        agreed("the checkpoint's FP8 state", [&] {
          const std::vector<std::string> unused = fp8_->set_state(st_.fp8);
          if (!unused.empty())
            term_.note("the checkpoint's FP8 state for " + std::to_string(unused.size()) +
                       " tensor(s) this model does not scale is ignored (e.g. " + unused.front() + ")");
        });
      if (resumed_) {
        resumed_at_ = st_.step;
        train_src_->seek(st_.data);
        term_.note("resumed from step " + std::to_string(st_.step) + " of " + dir_ + ": " +
                   checkpoint_size_text(dir_, st_.step, seconds_since(t0)));
      }
      st_.config_yaml = config_to_yaml(resolved_);
      st_.data_files = data_files_;
    }
    if (!resumed_) timed("initialisation", [&] { init_params(); });
    if (cfg_.checkpoint.every > 0) timed("checkpoint memory", [&] { ckpt_.prepare(*engine_, *layout_); });
    startup_s_ = process_age_s();  // the first step comes next (the run log's own opening is left out)
    timed("run log", [&] { open_log(); });
    char startup[64] = "";
    if (startup_s_ >= 0) std::snprintf(startup, sizeof startup, "; %.1f s from the process's start", startup_s_);
    term_.note("set-up: " + times + startup);
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

  // One run per directory: rank 0 locks it for the run's life; a run without --resume never writes
  // over an earlier one unless run.overwrite says so, and one with --resume finds out first what the
  // earlier run left (completed: nothing to do, or nothing it can do; a damaged log).
  void take_run_dir() {
    if (!lead_) return;
    check_run_dir(dir_, resume_, cfg_.run.overwrite);
    lock_ = std::make_unique<RunDirLock>(dir_);
    check_run_dir(dir_, resume_, cfg_.run.overwrite);  // again under the lock: another run may have just ended
    if (!resume_ && cfg_.run.overwrite && holds_run(dir_)) remove_earlier_run(dir_);
    // what the files behind data.train are (the same on every rank: shared after this phase)
    data_files_ = data_files_text(cfg_.data);
    if (resume_) earlier_ = check_earlier_run(dir_, t_.steps);
  }

  // Rank 0's data_files_ (take_run_dir) on every rank: each rank's checkpoint file records them.
  void share_data_files() {
    uint64_t n = data_files_.size();
    host_.broadcast(&n, sizeof n, 0);
    data_files_.resize(n);
    if (n) host_.broadcast(data_files_.data(), n, 0);
  }

  void build_model(int B) {
    model_.reset();
    model_ = std::make_unique<GPT>(plan_.dims, *layout_, *be_, B, plan_.seq_len, plan_.recompute, plan_.precision,
                                   fp8_.get());
    if (plan_.zero.gather_fp8)  // ZeRO-3: the products' weights gathered as FP8
      for (int l = 0; l < plan_.dims.n_layer; ++l) engine_->gather_fp8(layout_->layer_bucket(l), model_->fp8_weights(l));
    measured_.activations = model_->stored_bytes();
    measured_.workspace = model_->scratch_bytes();
  }

  void open_data() {
    const int B = plan_.micro_batch, T = plan_.seq_len, r = host_.rank();
    tok_.resize(size_t(B) * T * plan_.grad_accum);  // a step's micro-batches, read (and agreed) up front
    tgt_.resize(size_t(B) * T * plan_.grad_accum);
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
    // log.csv's files read and checked first: a refusal leaves the run log (and every file) as it was
    if (cfg_.log.csv) csv_ = std::make_unique<CsvLog>(dir_, resumed_ ? st_.step : -1, dir_ + "/log.h5");
    if (resume_ && !resumed_) {
      // starting over: the earlier run's log (and its CSV files) are kept, never overwritten
      const std::string kept = keep_earlier_log(dir_);
      if (!kept.empty())
        term_.note("the earlier run's log" +
                   (earlier_.log.exists ? " (status " + earlier_.log.status + ", last step " +
                                              std::to_string(earlier_.log.last_step) + ")"
                                        : std::string()) +
                   " is kept as " + kept + "; this run starts a new " + dir_ + "/log.h5");
    }
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
    info.ranks = host_.placement();
    info.shared_gpu = plan_.shared_gpu;
    info.startup_s = startup_s_;
    info.precision = fp8_ ? "fp8: " + fp8_->describe() : dtype_name(plan_.act);
    info.data_files = data_files_;
    if (world_ > 1 && !info.ranks.empty()) term_.note(describe_placement(info.ranks));
    log_ = std::make_unique<RunLog>(dir_ + "/log.h5", info, predict_memory(plan_), resumed_ ? st_.step : -1);
    sinks_ = {log_.get()};
    if (csv_) {
      csv_->open();
      if (!csv_->note().empty()) term_.note(csv_->note());
      sinks_.push_back(csv_.get());
    }
    sinks_.push_back(&term_);
    term_.memory_meaning(plan_.device == "cpu", double(predict_memory(plan_).total()), double(be_->baseline_bytes()));
    const std::string evals = eval_->describe();
    term_.note("train data: " + train_src_->describe() + (evals.empty() ? "" : "; " + evals));
  }

  struct StepResult {
    double loss, norm, lr;
  };

  // Reads the next n micro-batches of src into tok_/tgt_ on every rank, agreed (a bad shard or token id
  // may be in one rank's rows only).
  void fetch(TokenSource& src, int n, const char* what) {
    const size_t BT = size_t(plan_.micro_batch) * plan_.seq_len;
    agreed(what, [&] {
      for (int i = 0; i < n; ++i) src.next(tok_.data() + i * BT, tgt_.data() + i * BT);
    });
  }

  // One optimizer step on the fetched micro-batches: grad_accum micro-steps of forward and backward,
  // gradients reduced as the engine's policy says, the global norm, clipping, AdamW.
  StepResult train_step(int step) {
    const size_t BT = size_t(plan_.micro_batch) * plan_.seq_len;
    const float dloss = 1.0f / (float(BT) * plan_.grad_accum * world_);  // mean over every token of the step
    StepResult r{0, 0, lr_at(t_, step)};
    be_->op_profile_pause(false);  // the op profile covers training steps only, not evaluation or checkpoints
    if (fp8_ && !fp8_->calibrated()) calibrate_fp8(dloss);
    engine_->begin_step();
    for (int micro = 0; micro < plan_.grad_accum; ++micro) {
      engine_->begin_micro_step(micro + 1 == plan_.grad_accum);
      r.loss += model_->forward(*engine_, tok_.data() + micro * BT, tgt_.data() + micro * BT, true, dloss);
      faults_.at("step", step + 1);
      model_->backward(*engine_);
    }
    engine_->end_backward();
    r.loss = host_.sum(r.loss / plan_.grad_accum) / world_;
    r.norm = engine_->grad_norm();
    if (!std::isfinite(r.loss) || !std::isfinite(r.norm))
      throw Diverged(kExitFailure, "training diverged at step " + std::to_string(step + 1) + ": loss " +
                                       std::to_string(r.loss) + ", gradient norm " + std::to_string(r.norm) +
                                       "; nothing was checkpointed from it");
    engine_->update({float(r.lr), t_.beta1, t_.beta2, t_.eps, t_.weight_decay, clip_scale(r.norm, t_.grad_clip),
                     step + 1, splitmix64(cfg_.run.seed + uint64_t(step))});
    if (fp8_) fp8_->end_step(amax_reduction());  // this step's amaxes -> the next step's scales
    be_->synchronize();
    be_->op_profile_pause(true);
    return r;
  }

  // FP8's first scales: a run without an amax history quantizes at scale 1 in two forward and backward
  // passes over the step's first micro-batch, each recording every scaled tensor's amax (the second with
  // the scales the first gave, so that gradients no longer underflow); their gradients are thrown away.
  // A run resumed from a checkpoint that had no state for some tensors calibrates those alone.
  void calibrate_fp8(float dloss) {
    fp8_->reset_amax();
    for (int pass = 0; pass < 2; ++pass) {
      engine_->begin_step();
      engine_->begin_micro_step(true);
      model_->forward(*engine_, tok_.data(), tgt_.data(), true, dloss);
      model_->backward(*engine_);
      engine_->end_backward();
      fp8_->end_calibration_step(amax_reduction());
    }
    fp8_->calibration_done();
    fp8_->take_saturated();  // what saturated at scale 1 is not the first step's
  }

  // FP8: every rank quantizes with the same scales, so the amaxes are agreed (max over ranks) first.
  Fp8Scaling::ReduceMax amax_reduction() {
    Communicator* comm = stack_.comm.get();
    if (!comm || comm->world() == 1) return {};
    return [comm](float* amax, size_t n) {
      comm->all_reduce_max(amax, n);
      comm->join();
    };
  }

  // `wait`: on disk before training goes on (a stop, the end of the run); otherwise written meanwhile
  void checkpoint(bool wait) {
    if (fp8_) st_.fp8 = fp8_->state();
    const int64_t s = st_.step;
    SaveHooks hooks;
    hooks.before_write = [this, s] {
      faults_.at("checkpoint", s);
      faults_.hold("checkpoint_hold", s);
    };
    hooks.late = faults_.armed("checkpoint_late", s);
    hooks.on_disk_first = faults_.armed("checkpoint_done", s);
    ckpt_.save(st_, *engine_, *layout_, wait, std::move(hooks));
    if (plan_.device == "cpu") measured_.snapshot = ckpt_.snapshot_bytes();
  }

  // Rank 0 hands this step's rows to every metric sink (log.h5, log.csv's files, the terminal); a
  // failure (a full disk) is this rank's, told at the boundary, and the other sinks still get the rows.
  std::optional<Error> log_rows(const TrainRow& row, bool train_row, const EvalRow& ev) {
    if (!lead_) return std::nullopt;
    std::optional<Error> failed;
    for (MetricSink* s : sinks_) {
      try {
        if (s == log_.get()) faults_.at("log", st_.step);
        if (train_row) s->train_row(row);
        if (!ev.empty()) s->eval_row(ev);
      } catch (const Error& e) {
        if (!failed)
          failed = Error(e.code(), "writing the run log " + dir_ + "/" + s->name() + " failed: " + e.what() +
                                       full_disk_note(dir_));
      }
    }
    return failed;
  }

  // The end of a step, agreed by every rank in one reduction: a failure on some rank (its log write),
  // a non-finite optimizer state on some rank, a stop signal on some rank, or a background checkpoint
  // write still running on some rank (when none is, the checkpoint is published now). Returns whether to stop.
  bool boundary(const std::optional<Error>& failed) {
    const bool finite = engine_->state_finite();
    const long mine = (failed ? 8L * failed->code() : 0) + (ckpt_.busy_here() ? 4 : 0) + (finite ? 0 : 2) +
                      (stop_requested() ? 1 : 0);
    const long worst = host_.max(mine);
    if (worst >= 8) {
      if (failed) throw AgreedError(*failed);
      throw AgreedError(ExitCode(worst / 8), "step " + std::to_string(st_.step) + " failed on another rank");
    }
    if (worst & 2)
      throw Diverged(kExitFailure, "training diverged at step " + std::to_string(st_.step) +
                                       ": the optimizer state (parameters, master weights or the optimizer's moments) is not finite; nothing "
                                       "was checkpointed from it");
    if (ckpt_.in_flight() && !(worst & 4)) ckpt_.settle();
    return worst & 1;
  }

  bool eval_due(int64_t step) const {
    return (cfg_.eval.every > 0 && step % cfg_.eval.every == 0) || step == t_.steps;
  }

  // The evaluation of step st_.step into ev; false when a stop signal cut it short (every rank agrees),
  // which the terminal is told.
  bool evaluate(EvalRow& ev) {
    faults_.at("eval", st_.step);
    if (faults_.any("eval_data")) agreed("evaluation", [&] { faults_.at("eval_data", st_.step); });
    const auto e0 = std::chrono::steady_clock::now();
    ev = eval_->run(*model_, *engine_, st_.step);
    term_.count_eval(seconds_since(e0));
    if (eval_->stopped().empty()) return true;
    term_.note("the evaluation at step " + std::to_string(st_.step) + " was stopped by a signal during " +
               eval_->stopped() + ": it is not logged; a resumed run evaluates that step again first");
    return false;
  }

  // A stop signal, after the checkpoint of st_.step: the run ends `checkpointed` (exit 75).
  void stopped_by_signal(bool during_eval) {
    // Counted after the checkpoint, by when a signal sent to every rank at once has reached them all:
    // it shows whether the launcher passed it on to every rank on every node.
    const int seen = int(host_.sum(stop_requested() ? 1 : 0));
    status_ = "checkpointed";
    message_ = "stopped by a signal at step " + std::to_string(st_.step) + " (received by " + std::to_string(seen) +
               " of " + std::to_string(world_) + " ranks)" + (during_eval ? " during its evaluation" : "") +
               "; resume with --resume";
    exit_code_ = kExitCheckpointed;
    term_.note(message_);
  }

  void loop() {
    const double peak = be_->peak_flops() * world_;
    double avg_ms = 0;
    int timed = 0;
    const size_t set_up_bytes = be_->bytes_in_use();
    be_->reset_peak();
    const auto run_t0 = std::chrono::steady_clock::now();
    const double elapsed0 = log_ ? log_->elapsed_before() : 0.0;  // a resumed run's clock goes on
    // A resumed run whose checkpoint's step is due an evaluation its log lacks (a stop signal cut it short,
    // or came before it): that evaluation first, as the run would have had it.
    if (resumed_ && eval_due(st_.step) && host_.max(lead_ && log_ && log_->last_eval_step() < st_.step ? 1L : 0L)) {
      EvalRow ev;
      const bool cut = !evaluate(ev);
      const std::optional<Error> failed = log_rows(TrainRow(), false, ev);
      if (boundary(failed) && cut) return stopped_by_signal(true);  // its checkpoint is the one resumed from
    }
    for (int step = int(st_.step); step < t_.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      fetch(*train_src_, plan_.grad_accum, "reading the training data");
      const uint64_t gathered0 = stack_.comm ? stack_.comm->gathered_bytes() : 0;
      const StepResult r = train_step(step);
      const uint64_t gathered = (stack_.comm ? stack_.comm->gathered_bytes() : 0) - gathered0;
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
      const double mfu = peak > 0 ? plan_.flops_per_token * tps / peak : NAN;
      term_.count_step(ms, plan_.tokens_per_step, mfu);
      TrainRow row;
      using M = TrainMetric;
      row[M::step] = double(st_.step);
      row[M::loss] = r.loss;
      row[M::lr] = r.lr;
      row[M::grad_norm] = r.norm;
      row[M::step_ms] = ms;
      row[M::tokens_per_s] = tps;
      row[M::mfu] = mfu;
      row[M::elapsed_s] = elapsed0 + seconds_since(run_t0);
      row[M::tokens] = double(st_.step * plan_.tokens_per_step);
      const bool log_row = st_.step % cfg_.log.every == 0 || last || st_.step == 1;
      if (log_row) row[M::fp8_saturated] = fp8_ ? double(fp8_->take_saturated()) : 0.0;
      if (log_row) row[M::peak_memory] = double(be_->peak_bytes());
      row[M::gathered_bytes] = double(gathered);
      EvalRow ev;
      const bool cut = eval_due(st_.step) && !evaluate(ev);
      term_.progress(int(st_.step), (t_.steps - st_.step) * avg_ms / 1000.0);
      const std::optional<Error> failed = log_rows(row, log_row, ev);
      faults_.signal("sigterm", st_.step);
      const bool stop = boundary(failed);  // every rank stops at the same step
      const bool every = cfg_.checkpoint.every > 0;  // and the run's last step with checkpoints on
      // a stop at the last step ends the run as it would anyway, unless it cut the final evaluation short
      const bool stopped = stop && (!last || cut);
      if ((every && (st_.step % cfg_.checkpoint.every == 0 || last)) || stopped) checkpoint(stop || last);
      if (stopped) {
        stopped_by_signal(cut);
        return;
      }
    }
    ckpt_.settle();
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
  const FaultInjector faults_;
  std::unique_ptr<RunDirLock> lock_;  // rank 0: held for the run's life

  Stack stack_;
  Backend* be_ = nullptr;          // stack_'s, named for the loop
  ZeroEngine* engine_ = nullptr;
  const ParamLayout* layout_ = nullptr;
  std::unique_ptr<Fp8Scaling> fp8_;  // FP8 layers' scaling state (before the model that uses it)
  std::unique_ptr<GPT> model_;
  std::unique_ptr<TokenSource> train_src_;
  std::unique_ptr<Evaluator> eval_;
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<CsvLog> csv_;        // log.csv
  std::vector<MetricSink*> sinks_;     // rank 0: log_, csv_, the terminal
  std::vector<int> tok_, tgt_;
  Checkpointing ckpt_;  // after term_ and faults_: its writer thread (which calls faults_) is joined before they go

  TrainState st_;
  std::string data_files_;  // what data.train matches now (run/resume.hpp)
  EarlierRun earlier_;      // --resume: what the earlier run in the directory left (rank 0's view)
  bool resumed_ = false;
  int64_t resumed_at_ = -1;
  MemoryBreakdown measured_;
  double startup_s_ = -1;  // the run log's startup_s
  std::string status_ = "ok", message_;
  int exit_code_ = kExitOk;
};

}  // namespace

RunResult train(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume) {
  return Trainer(cfg, plan, host, point, resume).run();
}

}  // namespace gpt
