// The end of a trainer's step (its rows to every metric sink, the boundary every rank agrees on, the
// checkpoint) and of its run (a stop signal, a failure recorded, the checkpoint in flight salvaged, the
// outcome in the run log).
#include "run/trainer_impl.hpp"

#include <iostream>
#include <optional>
#include <string>

#include "run/signals.hpp"

namespace gpt {

// Rank 0 hands this step's rows to every metric sink (log.h5, log.csv's files, the terminal); a
// failure (a full disk) is this rank's, told at the boundary, and the other sinks still get the rows.
std::optional<Error> Trainer::log_rows(const TrainRow& row, bool train_row, const EvalRow& ev) {
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
bool Trainer::boundary(const std::optional<Error>& failed) {
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

// `wait`: on disk before training goes on (a stop, the end of the run); otherwise written meanwhile
void Trainer::checkpoint(bool wait) {
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

// A stop signal, after the checkpoint of st_.step: the run ends `checkpointed` (exit 75).
void Trainer::stopped_by_signal(bool during_eval) {
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

void Trainer::record(const Error& e) {
  status_ = e.code() == kExitOutOfMemory ? "oom" : "failed";
  message_ = e.what();
  if (e.code() == kExitOutOfMemory && message_.find("(model ") == std::string::npos)
    message_ = "out of memory for this config (" + describe(plan_) + "): " + message_;
  exit_code_ = e.code();
}

// The checkpoint in flight after a failure: published when its write completes (every rank is here).
void Trainer::salvage() {
  const std::string lost = ckpt_.salvage();
  if (!lost.empty()) message_ += "; " + lost;
}

void Trainer::end_job(const Error& e) {  // does not return: HostComm::abort ends the process
  std::cerr << "[rank " << host_.rank() << "] error: " << e.what() << "; ending every rank\n" << std::flush;
  record(e);
  finish_log();
  host_.abort(e.code());
}

// The outcome goes into the log; a log that cannot take it (a full disk) is reported, not fatal.
void Trainer::finish_log() {
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

}  // namespace gpt
