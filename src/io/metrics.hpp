// The metrics a run reports, each once, and the sinks it reports them to.
//
// Each metric is a line of one of the two tables below: its name (the run log's dataset under /train or
// /eval, the CSV column, the TensorBoard tag), its units, whether it is an integer, and what it means. The
// trainer fills a row (row[TrainMetric::loss] = ...) and hands it to every sink: the HDF5 run log
// (io/runlog.hpp), the terminal (run/terminal.hpp) and, with log.csv, train.csv and eval.csv
// (io/csv_log.hpp). A sink walks the table, so a new metric is its line here and the line of the
// trainer that measures it; a metric not measured in a row is NaN there.
#pragma once
#include <cmath>
#include <string>

namespace gpt {

// X(name, units, integer, documentation)
#define GPT_TRAIN_METRICS(X)                                                                              \
  X(step, "steps", true, "optimizer steps completed")                                                    \
  X(loss, "nats/token", false, "mean training loss of the step over every token of every rank")          \
  X(lr, "1", false, "learning rate of the step")                                                         \
  X(grad_norm, "1", false, "global L2 norm of the gradient, before clipping")                            \
  X(step_ms, "ms", false, "wall time of the step")                                                       \
  X(tokens_per_s, "tokens/s", false, "tokens of the step (all ranks) over its wall time")                \
  X(mfu, "fraction", false, "model FLOPs utilisation: 6N + 6LCT FLOPs per token over the devices' peak") \
  X(elapsed_s, "s", false, "wall clock since the run's first step (continued across resumes)")          \
  X(tokens, "tokens", true, "tokens trained on up to and including this step, all ranks")               \
  X(fp8_saturated, "tensors", true, "precision fp8: scaled tensors whose values were clipped since the last row") \
  X(peak_memory, "bytes", true, "peak device memory of rank 0 so far (CPU: the process's peak RSS)")       \
  X(gathered_bytes, "bytes", true, "bytes rank 0 received from the other ranks through all-gathers in the " \
    "step: ZeRO-3's parameter gathers, ZeRO-1/2's after the update (0 on one rank)")                     \
  X(offload_ms, "ms", false, "training.offload: rank 0's wall time of the optimizer's loops on the host in " \
    "the step (NaN without offload)")                                                                     \
  X(offload_wait_ms, "ms", false, "training.offload: the rest of rank 0's update: waiting for the "      \
    "gradients to come down and queueing the parameters' way up (NaN without offload)")

#define GPT_EVAL_METRICS(X)                                                                               \
  X(step, "steps", true, "optimizer steps completed when the evaluation ran")                           \
  X(val_loss, "nats/token", false, "mean loss over eval.batches of the validation data")                 \
  X(hellaswag_acc, "fraction", false, "HellaSwag: the ending with the lowest summed loss is right")      \
  X(hellaswag_acc_norm, "fraction", false, "HellaSwag: the ending with the lowest mean loss per token is right")

struct MetricInfo {
  const char* name;
  const char* units;
  bool integer;
  const char* doc;
};

#define GPT_METRIC_ENUM(name, units, integer, doc) name,
#define GPT_METRIC_INFO(name, units, integer, doc) {#name, units, integer, doc},
enum class TrainMetric : int { GPT_TRAIN_METRICS(GPT_METRIC_ENUM) count };
enum class EvalMetric : int { GPT_EVAL_METRICS(GPT_METRIC_ENUM) count };
inline constexpr MetricInfo kTrainMetrics[] = {GPT_TRAIN_METRICS(GPT_METRIC_INFO)};
inline constexpr MetricInfo kEvalMetrics[] = {GPT_EVAL_METRICS(GPT_METRIC_INFO)};
#undef GPT_METRIC_ENUM
#undef GPT_METRIC_INFO
inline constexpr int kTrainMetricCount = int(TrainMetric::count);
inline constexpr int kEvalMetricCount = int(EvalMetric::count);

// One row of values, by metric; NaN where a metric was not measured.
template <class M, int N>
struct MetricRow {
  double v[N];
  MetricRow() {
    for (double& x : v) x = NAN;
  }
  double& operator[](M m) { return v[int(m)]; }
  double operator[](M m) const { return v[int(m)]; }
  bool has(M m) const { return !std::isnan(v[int(m)]); }
};
using TrainRow = MetricRow<TrainMetric, kTrainMetricCount>;

// One evaluation: its metrics and the sample the model generated (text; token ids without a vocabulary).
struct EvalRow : MetricRow<EvalMetric, kEvalMetricCount> {
  std::string sample;
  bool empty() const {  // nothing but the step was measured
    for (int i = 1; i < kEvalMetricCount; ++i)
      if (!std::isnan(v[i])) return false;
    return sample.empty();
  }
};

// Where a run's metrics go. Rank 0 calls a sink with every logged training row and every evaluation.
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual std::string name() const = 0;  // for messages: "log.h5", "train.csv"
  virtual void train_row(const TrainRow& r) = 0;
  virtual void eval_row(const EvalRow& r) = 0;
};

}  // namespace gpt
