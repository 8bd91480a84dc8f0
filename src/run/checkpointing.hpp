// The trainer's checkpoints: when a save waits for the disk, what a failed write does
// (checkpoint.on_error), and what is said about each. The writing itself is io/checkpoint_writer.hpp's.
#pragma once
#include <functional>
#include <string>

#include "config/config.hpp"
#include "io/checkpoint_writer.hpp"
#include "run/terminal.hpp"

namespace gpt {

class Checkpointing {
 public:
  Checkpointing(const CheckpointConfig& cfg, const std::string& run_dir, HostComm& host, Terminal& term);

  // The snapshot's host memory, allocated and page-locked at the start of a run that checkpoints (else
  // by its first checkpoint, agreed with the write); says so when it could not be page-locked.
  void prepare(ZeroEngine& engine, const ParamLayout& layout);
  // Collective: waits for the checkpoint in flight, then starts one of st; with `wait` (or
  // checkpoint.async false) it is on disk and published when this returns.
  void save(const TrainState& st, ZeroEngine& engine, const ParamLayout& layout, bool wait,
            std::function<void()> before_write);
  // Collective: waits for the checkpoint in flight (if any) and publishes it.
  void settle();
  bool in_flight() const { return writer_.in_flight(); }
  bool busy_here() const { return writer_.busy_here(); }
  // Failed writes that checkpoint.on_error: continue trained past ("" if none), for the log's message.
  const std::string& errors() const { return errors_; }
  size_t snapshot_bytes() const { return writer_.snapshot_bytes(); }

 private:
  template <class Fn>
  void guarded(Fn&& fn);

  const CheckpointConfig& cfg_;
  const std::string dir_;
  HostComm& host_;
  Terminal& term_;
  CheckpointWriter writer_;
  std::string errors_;
};

}  // namespace gpt
