// log.csv: the run's metrics as train.csv and eval.csv beside log.h5, a column per metric of
// io/metrics.hpp (eval.csv also the sample's text), a row per logged step and per evaluation, each row
// flushed as it is written. log.h5 stays the source of truth; these are for tools that read CSV.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

#include "io/metrics.hpp"

namespace gpt {

class CsvLog final : public MetricSink {
 public:
  // Creates dir/train.csv and dir/eval.csv, or with resume_step >= 0 keeps the rows of steps up to it
  // (under this table's columns: a column the file lacks is empty in its old rows) and appends after them.
  CsvLog(const std::string& dir, int64_t resume_step);
  std::string name() const override { return "train.csv/eval.csv"; }
  void train_row(const TrainRow& r) override;
  void eval_row(const EvalRow& r) override;

 private:
  std::string dir_;
  std::ofstream train_, eval_;
};

// A field as CSV writes it: numbers as the shortest text that reads back (integers without a point,
// NaN empty), text quoted when it holds a comma, a quote or a line break.
std::string csv_number(double v, bool integer);
std::string csv_text(const std::string& s);

}  // namespace gpt
