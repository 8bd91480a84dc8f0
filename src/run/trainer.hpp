// The trainer: builds backend, communicator, model and ZeRO engine from a Config and runs the loop.
#pragma once
#include <memory>
#include <string>

#include "dist/comm.hpp"
#include "config/config.hpp"
#include "io/data.hpp"
#include "model/gpt.hpp"
#include "dist/zero.hpp"

namespace gpt {

// Everything derived from the config and the world size before any memory is touched.
struct Plan {
  ModelDims dims;
  std::string device;     // resolved: cpu | cuda
  DType act = DType::F32;
  int micro_batch = 0, seq_len = 0, grad_accum = 1, world = 1;
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;
  size_t n_params = 0;
  BackendOptions backend;  // what the backend is built with (local_rank filled in per rank)
};
Plan make_plan(const Config& cfg, int world);
MemoryBreakdown predict_memory(const Config& cfg, const Plan& plan);
double lr_at(const TrainingConfig& t, int step);  // step is 0-based
// Factor applied to every gradient so that the global L2 norm is at most clip (clip 0: off).
float clip_scale(double norm, float clip);
std::string format_bytes(double b);
// Prints the config table and the memory prediction (the --dry-run output).
void print_plan(const Config& cfg, const Plan& plan, const MemoryBreakdown& mem);

// Identifies a sweep point in the run log.
struct PointInfo {
  int64_t index = -1;
  std::string values;     // "key=value" lines
};

// Outcome of a run, as recorded in its log.
struct RunResult {
  std::string status;     // ok | failed | oom | checkpointed
  std::string message;
  int exit_code = 0;
};

// Trains one run. Errors that end the run are recorded in the log and returned (not thrown) when they
// are the run's own (bad config value, OOM, NaN); host-level failures still throw.
RunResult train(const Config& cfg, HostComm& host, const PointInfo& point, bool resume);

// Set by SIGUSR1/SIGTERM/SIGINT: finish the step, checkpoint, exit 75.
void install_stop_signals();
bool stop_requested();

}  // namespace gpt
