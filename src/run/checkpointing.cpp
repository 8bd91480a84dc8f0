#include "run/checkpointing.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

namespace gpt {

Checkpointing::Checkpointing(const CheckpointConfig& cfg, const std::string& run_dir, HostComm& host,
                             Terminal& term, bool device_copies)
    : cfg_(cfg), dir_(run_dir), host_(host), term_(term), device_copies_(device_copies),
      writer_(run_dir, host, cfg.keep_last, cfg.threads) {}

// A failed checkpoint is agreed on every rank; `continue` reports it and trains on with the previous one.
template <class Fn>
void Checkpointing::guarded(Fn&& fn) {
  try {
    fn();
  } catch (const AgreedError& e) {
    if (cfg_.on_error != OnError::go_on) throw;
    const std::string m = std::string(e.what()) + "; training goes on (checkpoint.on_error: continue) and " +
                          "the previous checkpoint is kept";
    if (host_.rank() == 0) std::cerr << "error: " << m << "\n" << std::flush;
    errors_ += (errors_.empty() ? "" : "; ") + m;
  }
}

Checkpointing::~Checkpointing() {
  if (reserving_.joinable()) reserving_.join();
}

void Checkpointing::prepare(ShardedState& engine, const ParamLayout& layout) {
  if (!device_copies_) {  // the host copies the state itself: nothing to page-lock, nothing to wait for
    pinned_ = writer_.reserve(engine, layout);
    reserved();
    return;
  }
  // Page-locking takes about 0.3 s a GiB (bench/host_pinning): on its own thread, beside the first steps.
  // The engine's layout and the backend outlive this object (the trainer declares it after them).
  reserving_ = std::thread([this, &engine, &layout] {
    try {
      pinned_ = writer_.reserve(engine, layout);
    } catch (...) {
      reserve_error_ = std::current_exception();
    }
  });
}

void Checkpointing::reserved() {
  if (reserving_.joinable()) reserving_.join();
  if (reserve_error_) std::rethrow_exception(std::exchange(reserve_error_, nullptr));
  if (!pinned_)
    std::cerr << "warning: rank " << host_.rank() << " could not page-lock the " << writer_.snapshot_bytes()
              << " bytes of host memory its checkpoints are copied into: the copies hold training longer\n";
  pinned_ = true;  // said once
}

void Checkpointing::save(const TrainState& st, ShardedState& engine, const ParamLayout& layout, bool wait,
                         SaveHooks hooks) {
  reserved();
  settle();  // one in flight at most: its memory is this one's
  guarded([&] { writer_.start(st, engine, layout, std::move(hooks.before_write), hooks.late); });
  if (hooks.on_disk_first) writer_.wait_here();
  if (wait || !cfg_.async) settle();
}

void Checkpointing::settle() {
  std::optional<CheckpointOutcome> done;
  guarded([&] { done = writer_.finish(); });
  if (done) report(*done);
}

std::string Checkpointing::salvage() {
  if (!writer_.in_flight()) return "";
  try {
    report(writer_.finish(cfg_.stall_s));
    return "";
  } catch (const std::exception& e) {
    if (host_.rank() == 0) std::cerr << "error: " << e.what() << "; the previous checkpoint is kept\n" << std::flush;
    return std::string("the checkpoint being written was not kept: ") + e.what();
  }
}

void Checkpointing::report(const CheckpointOutcome& o) {
  if (o.step < 0 || host_.rank() != 0) return;
  // every rank's file, over rank 0's time: the checkpoint's rate when the ranks share one disk
  char held[32];
  std::snprintf(held, sizeof held, "%.2f", o.stall_s);
  // on a GPU the copies run beside the next step; on the CPU they are made before training goes on
  const std::string how = device_copies_ ? std::string("snapshot queued in ") + held +
                                               " s (the next update waits on the device for its copies)"
                                         : std::string("snapshot copied in ") + held +
                                               " s (training waited for the copy)";
  term_.note("checkpoint written at step " + std::to_string(o.step) + ": " +
             checkpoint_size_text(dir_, o.step, o.written_s) + "; " + how);
}

}  // namespace gpt
