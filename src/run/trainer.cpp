// The trainer's algorithm: a run (set-up, the loop, its outcome) and the loop of optimizer steps, each step's
// micro-batches fetched, forward and backward, the update, evaluations when due; the end of each step (rows
// logged, the agreed boundary, checkpoints) is trainer_end.cpp's, set-up trainer_setup.cpp's.
#include "run/trainer.hpp"

#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>

#include "config/config_io.hpp"
#include "io/checkpoint.hpp"
#include "run/schedule.hpp"
#include "run/trainer_impl.hpp"

namespace gpt {

Trainer::Trainer(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume)
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
RunResult Trainer::run() {
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

void Trainer::loop() {
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
    row[M::offload_ms] = engine_->offload_ms();
    row[M::offload_wait_ms] = engine_->offload_wait_ms();
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

// Reads the next n micro-batches of src into tok_/tgt_ on every rank, agreed (a bad shard or token id
// may be in one rank's rows only).
void Trainer::fetch(TokenSource& src, int n, const char* what) {
  const size_t BT = size_t(plan_.micro_batch) * plan_.seq_len;
  agreed(what, [&] {
    for (int i = 0; i < n; ++i) src.next(tok_.data() + i * BT, tgt_.data() + i * BT);
  });
}

// One optimizer step on the fetched micro-batches: grad_accum micro-steps of forward and backward,
// gradients reduced as the engine's policy says, the global norm, clipping, AdamW.
Trainer::StepResult Trainer::train_step(int step) {
  const size_t BT = size_t(plan_.micro_batch) * plan_.seq_len;
  const float dloss = 1.0f / (float(BT) * plan_.grad_accum * world_);  // mean over every token of the step
  StepResult r{0, 0, lr_at(t_, step)};
  be_->op_profile_pause(false);  // the op profile covers training steps only, not evaluation or checkpoints
  if (fp8_ && !fp8_->calibrated()) calibrate_fp8(dloss);
  engine_->begin_step();
  // training.gradient_release: no clipping, so the update's hyperparameters are known before the backward
  const OptimizerHyper h{float(r.lr), t_.weight_decay, 1.0f, step + 1, splitmix64(cfg_.run.seed + uint64_t(step))};
  if (plan_.zero.release_grads) engine_->release_step(h);
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
  engine_->update({h.lr, h.weight_decay, clip_scale(r.norm, t_.grad_clip), h.step, h.seed});
  if (fp8_) fp8_->end_step(amax_reduction());  // this step's amaxes -> the next step's scales
  be_->synchronize();
  be_->op_profile_pause(true);
  return r;
}

// FP8's first scales: a run without an amax history quantizes at scale 1 in two forward and backward
// passes over the step's first micro-batch, each recording every scaled tensor's amax (the second with
// the scales the first gave, so that gradients no longer underflow); their gradients are thrown away.
// A run resumed from a checkpoint that had no state for some tensors calibrates those alone.
void Trainer::calibrate_fp8(float dloss) {
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
Fp8Scaling::ReduceMax Trainer::amax_reduction() {
  Communicator* comm = stack_.comm.get();
  if (!comm || comm->world() == 1) return {};
  return [comm](float* amax, size_t n) {
    comm->all_reduce_max(amax, n);
    comm->join();
  };
}

bool Trainer::eval_due(int64_t step) const {
  return (cfg_.eval.every > 0 && step % cfg_.eval.every == 0) || step == t_.steps;
}

// The evaluation of step st_.step into ev; false when a stop signal cut it short (every rank agrees),
// which the terminal is told.
bool Trainer::evaluate(EvalRow& ev) {
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

RunResult train(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume) {
  return Trainer(cfg, plan, host, point, resume).run();
}

}  // namespace gpt
