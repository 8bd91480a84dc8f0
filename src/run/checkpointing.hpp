// The trainer's checkpoints: when a save waits for the disk, what a failed write does
// (checkpoint.on_error), what becomes of the write in flight when the run fails, and what is said about
// each. The writing itself is io/checkpoint_writer.hpp's.
#pragma once
#include <exception>
#include <functional>
#include <string>
#include <thread>

#include "config/config.hpp"
#include "io/checkpoint_writer.hpp"
#include "run/terminal.hpp"

namespace gpt {

// Testing hooks for one save (run/faults.hpp): before_write runs on the writer thread before its first
// byte; `late`: the write waits to start until the run waits for it; `on_disk_first`: the main thread
// waits for this rank's write before training goes on (it is still published at the usual boundary).
struct SaveHooks {
  std::function<void()> before_write;
  bool late = false, on_disk_first = false;
};

class Checkpointing {
 public:
  // device_copies: the snapshot is copied from a device beside the next step (a GPU), not by the host.
  Checkpointing(const CheckpointConfig& cfg, const std::string& run_dir, HostComm& host, Terminal& term,
                bool device_copies);

  ~Checkpointing();  // waits for the snapshot's memory if it is still being page-locked
  Checkpointing(const Checkpointing&) = delete;
  Checkpointing& operator=(const Checkpointing&) = delete;

  // The snapshot's host memory, allocated and page-locked at the start of a run that checkpoints (else
  // by its first checkpoint, agreed with the write). Copied from a device, it is page-locked on a thread
  // of its own while training starts (seconds for a large model), and the first save waits for it; says
  // so when it could not be page-locked.
  void prepare(ShardedState& engine, const ParamLayout& layout);
  // Collective: waits for the checkpoint in flight, then starts one of st; with `wait` (or
  // checkpoint.async false) it is on disk and published when this returns.
  void save(const TrainState& st, ShardedState& engine, const ParamLayout& layout, bool wait, SaveHooks hooks);
  // Collective: waits for the checkpoint in flight (if any) and publishes it.
  void settle();
  // Collective, on the way out of a run that failed on every rank together (or on its one rank): the
  // checkpoint in flight, if any, is waited for as long as its write makes progress (checkpoint.stall_s
  // without a byte gives up on it) and published when it completed; one that failed is discarded.
  // Never throws: returns what went wrong for the run's message ("" when nothing did).
  std::string salvage();
  bool in_flight() const { return writer_.in_flight(); }
  bool busy_here() const { return writer_.busy_here(); }
  // Failed writes that checkpoint.on_error: continue trained past ("" if none), for the log's message.
  const std::string& errors() const { return errors_; }
  size_t snapshot_bytes() const { return writer_.snapshot_bytes(); }

 private:
  template <class Fn>
  void guarded(Fn&& fn);
  void reserved();  // the memory prepare() started on, ready (its failure thrown here)
  void report(const CheckpointOutcome& o);

  const CheckpointConfig& cfg_;
  const std::string dir_;
  HostComm& host_;
  Terminal& term_;
  const bool device_copies_;
  CheckpointWriter writer_;
  std::thread reserving_;             // page-locks the snapshot's memory (prepare, device copies)
  std::exception_ptr reserve_error_;  // what it threw, for the main thread
  bool pinned_ = true;
  std::string errors_;
};

}  // namespace gpt
