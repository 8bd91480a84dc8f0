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
  // Decides what dir/train.csv and dir/eval.csv start with, reading and checking but writing nothing (a
  // refusal leaves every file as it was): a new run, nothing; a resumed run (resume_step >= 0), the rows
  // of steps up to resume_step, from the file (under this table's columns: a column the file lacks is
  // empty in its old rows; an unterminated last line, a write cut short by a kill, is dropped) or, for a
  // file that is not there (log.csv turned on at this resume), from the run log log_path, the source of
  // truth. A row whose step is not a whole number, an unreadable log or a file that cannot be replaced
  // is input_error naming the file (and line).
  CsvLog(const std::string& dir, int64_t resume_step, const std::string& log_path);
  // Writes the files with those rows (each aside, then renamed) and opens them for appending.
  void open();
  // What the files took from the run log ("" when nothing), for the terminal.
  const std::string& note() const { return note_; }
  std::string name() const override { return "train.csv/eval.csv"; }
  void train_row(const TrainRow& r) override;
  void eval_row(const EvalRow& r) override;

 private:
  std::string dir_, train_text_, eval_text_, note_;
  std::ofstream train_, eval_;
};

// A field as CSV writes it: numbers as the shortest text that reads back (integers without a point,
// NaN empty), text quoted when it holds a comma, a quote or a line break.
std::string csv_number(double v, bool integer);
std::string csv_text(const std::string& s);

}  // namespace gpt
