// The Trainer behind train() (run/trainer.hpp), for the files that define it: the loop (trainer.cpp), set-up
// (trainer_setup.cpp), the end of a step and of the run (trainer_end.cpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/agree.hpp"
#include "io/checkpoint.hpp"
#include "io/csv_log.hpp"
#include "io/data.hpp"
#include "io/run_dir.hpp"
#include "io/runlog.hpp"
#include "model/gpt.hpp"
#include "run/checkpointing.hpp"
#include "run/eval.hpp"
#include "run/faults.hpp"
#include "run/resume.hpp"
#include "run/stack.hpp"
#include "run/terminal.hpp"
#include "run/trainer.hpp"

namespace gpt {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  Trainer(const Config& cfg, const Plan& plan, HostComm& host, const PointInfo& point, bool resume);
  RunResult run();

 private:
  struct StepResult {
    double loss, norm, lr;
  };

  // the loop (trainer.cpp)
  void loop();
  void fetch(TokenSource& src, int n, const char* what);
  StepResult train_step(int step);
  void calibrate_fp8(float dloss);
  Fp8Scaling::ReduceMax amax_reduction();
  bool eval_due(int64_t step) const;
  bool evaluate(EvalRow& ev);

  // set-up (trainer_setup.cpp)
  void setup();
  bool runs_at(int B, double cap);
  void take_run_dir();
  void share_data_files();
  void build_model(int B);
  void open_data();
  void init_params();
  void open_log();

  // the end of a step and of the run (trainer_end.cpp)
  std::optional<Error> log_rows(const TrainRow& row, bool train_row, const EvalRow& ev);
  bool boundary(const std::optional<Error>& failed);
  void checkpoint(bool wait);
  void stopped_by_signal(bool during_eval);
  void record(const Error& e);
  void salvage();
  void end_job(const Error& e);
  void finish_log();

  template <class Fn>
  void agreed(const char* phase, Fn&& fn) {
    gpt::agreed(host_, phase, std::forward<Fn>(fn));
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

}  // namespace gpt
