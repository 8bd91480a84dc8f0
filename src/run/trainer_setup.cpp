// The trainer's set-up: the run directory, the stack and the model (micro_batch: max found first), the data,
// the parameters (from a checkpoint, a model file or GPT-2's initialisation) and the run log.
#include "run/trainer_impl.hpp"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/revision.hpp"
#include "config/config_io.hpp"
#include "io/modelfile.hpp"
#include "model/init.hpp"
#include "run/max_batch.hpp"
#include "run/memory_fit.hpp"


namespace gpt {

namespace {

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

}  // namespace

void Trainer::setup() {
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
    if (plan_.model.precision.any_fp8()) fp8_ = std::make_unique<Fp8Scaling>(*be_, plan_.fp8_recipe);
  });
  if (plan_.micro_batch_max) {
    // the allocations' share of memory_limit_gb (a GPU's context and libraries take the rest: memory_fit.hpp)
    const double cap = allocation_budget(double(t_.memory_limit_gb) * double(1ull << 30), plan_.device);
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
  // what this run's checkpoints record of it (a resume's load replaces the state's copy: said again after it)
  const auto describe_run = [&] {
    st_.config_yaml = config_to_yaml(resolved_);
    st_.data_files = data_files_;
    st_.precision = precision_attrs(plan_.model.precision, plan_.model.dims.n_layer);
  };
  describe_run();
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
    describe_run();
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
bool Trainer::runs_at(int B, double cap) {
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
void Trainer::take_run_dir() {
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
void Trainer::share_data_files() {
  uint64_t n = data_files_.size();
  host_.broadcast(&n, sizeof n, 0);
  data_files_.resize(n);
  if (n) host_.broadcast(data_files_.data(), n, 0);
}

void Trainer::build_model(int B) {
  model_.reset();
  model_ = std::make_unique<GPT>(plan_.model, *layout_, *be_, B, plan_.seq_len, plan_.recompute, fp8_.get(),
                                 plan_.logits_chunk);
  if (plan_.zero.gather_fp8)  // ZeRO-3: the FP8 layers' product weights gathered as FP8
    for (int l = 0; l < plan_.model.dims.n_layer; ++l)
      if (plan_.model.precision.layer_fp8(l)) engine_->gather_fp8(layout_->layer_bucket(l), model_->fp8_weights(l));
  measured_.activations = model_->stored_bytes();
  measured_.workspace = model_->scratch_bytes();
}

void Trainer::open_data() {
  const int B = plan_.micro_batch, T = plan_.seq_len, r = host_.rank();
  tok_.resize(size_t(B) * T * plan_.grad_accum);  // a step's micro-batches, read (and agreed) up front
  tgt_.resize(size_t(B) * T * plan_.grad_accum);
  if (cfg_.data.synthetic)
    train_src_ = make_synthetic_source(cfg_.data, cfg_.run.seed, 0, B, T, r, world_);
  else
    train_src_ = make_shard_source(cfg_.data.train, B, T, r, world_, plan_.model.dims.vocab_size,
                                   ShardOrder{cfg_.data.shuffle, cfg_.run.seed});
  eval_ = std::make_unique<Evaluator>(cfg_, plan_, host_);
}

// Parameters from an llm.c model file, or GPT-2's initialisation.
void Trainer::init_params() {
  if (!cfg_.model.init_from.empty()) {
    const std::vector<float> file_params = read_model_file(cfg_.model.init_from, *layout_);
    for (int b = 0; b < layout_->n_buckets(); ++b)
      engine_->set_bucket_params(b, file_params.data() + layout_->logical_offset(b));
    return;
  }
  // drawn where the parameters live, a bucket at a time
  for (int b = 0; b < layout_->n_buckets(); ++b) {
    float* values = static_cast<float*>(be_->alloc(4 * layout_->bucket(b).size));
    init_bucket(*layout_, b, cfg_.run.seed, cfg_.model.init_std, *be_, values);
    engine_->set_bucket_params(b, values, true);
    be_->free(values);
  }
}

void Trainer::open_log() {
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
  info.git_rev = build_revision();
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

}  // namespace gpt
