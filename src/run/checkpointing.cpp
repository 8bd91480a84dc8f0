#include "run/checkpointing.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

namespace gpt {

Checkpointing::Checkpointing(const CheckpointConfig& cfg, const std::string& run_dir, HostComm& host,
                             Terminal& term)
    : cfg_(cfg), dir_(run_dir), host_(host), term_(term), writer_(run_dir, host, cfg.keep_last, cfg.threads) {}

// A failed checkpoint is agreed on every rank; `continue` reports it and trains on with the previous one.
template <class Fn>
void Checkpointing::guarded(Fn&& fn) {
  try {
    fn();
  } catch (const AgreedError& e) {
    if (cfg_.on_error != "continue") throw;
    const std::string m = std::string(e.what()) + "; training goes on (checkpoint.on_error: continue) and " +
                          "the previous checkpoint is kept";
    if (host_.rank() == 0) std::cerr << "error: " << m << "\n" << std::flush;
    errors_ += (errors_.empty() ? "" : "; ") + m;
  }
}

void Checkpointing::prepare(ZeroEngine& engine, const ParamLayout& layout) {
  if (!writer_.reserve(engine, layout))
    std::cerr << "warning: rank " << host_.rank() << " could not page-lock the " << writer_.snapshot_bytes()
              << " bytes of host memory its checkpoints are copied into: the copies hold training longer\n";
}

void Checkpointing::save(const TrainState& st, ZeroEngine& engine, const ParamLayout& layout, bool wait,
                         std::function<void()> before_write) {
  settle();  // one in flight at most: its memory is this one's
  guarded([&] { writer_.start(st, engine, layout, std::move(before_write)); });
  if (wait || !cfg_.async) settle();
}

void Checkpointing::settle() {
  std::optional<CheckpointOutcome> done;
  guarded([&] { done = writer_.finish(); });
  if (!done || done->step < 0 || host_.rank() != 0) return;
  const CheckpointOutcome& o = *done;
  // every rank's file, over rank 0's time: the checkpoint's rate when the ranks share one disk
  char queued[32];
  std::snprintf(queued, sizeof queued, "%.2f", o.stall_s);
  const std::string buf = "checkpoint written at step " + std::to_string(o.step) + ": " +
                          checkpoint_size_text(dir_, o.step, o.written_s) + "; snapshot queued in " + queued +
                          " s (the next update waits on the device for its copies)";
  term_.note(buf);
}

}  // namespace gpt
