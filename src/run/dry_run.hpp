// --dry-run: every chosen point planned for its configured device (which need not be on this machine),
// the files it reads checked, and the result printed: one point's whole plan, or for a sweep one table
// with a row per point. Nothing is written.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "parallel/comm.hpp"
#include "run/sweep.hpp"

namespace gpt {
// Throws input_error naming the key or the file of the first point that cannot run.
void dry_run(const Config& base, const Sweep& sw, const std::vector<int>& indices, HostComm& host);

// What the points checked so far have read: each input is read once however many points share it.
struct InputsChecked {
  std::map<std::string, std::string> data_lines;  // per data glob, what it holds (the dry run prints them)
  std::set<std::string> files;                     // the other inputs checked
};
// What a run of this point reads, checked by the code the run reads it with, so that bad input is an
// error before anything is written: the training and validation shards' headers (and every validation
// token against the vocabulary), the evaluation inputs (eval.hellaswag, eval.vocab, the sample prompt)
// and, unless the run resumes, model.init_from whole (dimensions, length, every weight finite). Throws
// input_error naming the key or the file.
void check_inputs(const Config& cfg, const Plan& plan, InputsChecked& seen);
}  // namespace gpt
