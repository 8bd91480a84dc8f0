// Multiple-choice scoring (HellaSwag, as GPT-2 reproductions evaluate it): each ending follows its
// context in one row of the model's micro-batch, and its token losses are summed over the ending's tokens.
// The prediction is the ending of the lowest summed loss (`acc`) or of the lowest mean loss per token
// (`acc_norm`, the length-normalised one GPT-2 reproductions report).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/comm.hpp"
#include "io/evalfile.hpp"
#include "model/gpt.hpp"

namespace gpt {

struct ChoiceAccuracy {
  double acc = 0, acc_norm = 0;  // fractions of the examples
  int64_t examples = 0;
  bool stopped = false;          // `stop` said so before the last forward pass: acc and acc_norm are NaN
};

// The predicted ending by summed and by mean loss (the first of equal ones).
struct ChoicePick {
  int by_sum = 0, by_mean = 0;
};
ChoicePick pick_ending(const std::vector<double>& loss_sums, const std::vector<int>& n_tokens);

// Scores every example on all ranks together: rank r takes examples r, r + world, ..., and every rank
// runs the same number of forward passes (padded), as they are collective under ZeRO-3. A row longer than
// the model's T + 1 tokens keeps its last T + 1 (the context's first tokens are dropped). `stop`, asked
// before every forward pass on every rank (a collective: the same answer everywhere), ends the scoring early.
ChoiceAccuracy score_choices(const std::vector<ChoiceExample>& examples, GPT& model, ParamStore& ps, HostComm& host,
                             const std::function<bool()>& stop = {});

}  // namespace gpt
