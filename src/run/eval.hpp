// Evaluation during training: validation loss, HellaSwag accuracy and a generated sample, each when the
// config's eval section asks for it, on all ranks together.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "parallel/comm.hpp"
#include "io/bpe.hpp"
#include "io/data.hpp"
#include "io/evalfile.hpp"
#include "io/runlog.hpp"
#include "model/gpt.hpp"
#include "run/plan.hpp"

namespace gpt {

class Evaluator {
 public:
  // Opens what cfg.eval asks for (validation shards, the HellaSwag file, the vocabulary) and reads the
  // sample prompt; input errors name the key or the file.
  Evaluator(const Config& cfg, const Plan& plan, HostComm& host);
  // Collective: one evaluation of model after `step` optimizer steps. A stop signal (run/signals.hpp) on
  // any rank ends it between two batches: what finished before is in the row, the rest NaN (no sample).
  EvalRow run(GPT& model, ParamStore& ps, int64_t step);
  // What the last run() left out because of a stop signal ("" when it was whole), for the terminal.
  const std::string& stopped() const { return stopped_; }
  std::string describe() const;  // what is evaluated, for the terminal

 private:
  double val_loss(GPT& model, ParamStore& ps);
  std::string sample(GPT& model, ParamStore& ps, int64_t step);
  // Collective, between batches: whether a stop signal has reached some rank (the same answer on every rank).
  bool stopping();

  const EvalConfig ec_;
  const uint64_t seed_;
  HostComm& host_;
  std::unique_ptr<TokenSource> val_;
  std::vector<ChoiceExample> hellaswag_;
  std::unique_ptr<Gpt2Vocab> vocab_;
  std::vector<int> prompt_;
  std::vector<int> tok_, tgt_;
  std::string stopped_;
};

// The sample prompt's token ids: ids separated by commas or spaces, else text encoded with vocab (an
// input error naming eval.sample_prompt without one); empty = {vocab_size - 1}.
std::vector<int> sample_prompt_ids(const std::string& prompt, const Gpt2Vocab* vocab, int vocab_size);

// What evaluation will read, checked before any work (the run directory included) and in a dry run, so a
// bad input is named at once rather than at the first evaluation, possibly after all of the training:
// every validation shard whole (header, size, each token id within the vocabulary), the HellaSwag file
// (token ids, at least one example), the vocabulary and the sample prompt. Input errors name the key and
// the file. `checked` remembers what was checked (sweep points share their inputs): each is read once.
void check_eval_inputs(const Config& cfg, const Plan& plan, std::set<std::string>& checked);


}  // namespace gpt
