#include "run/hellaswag.hpp"

#include <algorithm>
#include <cmath>

namespace gpt {

namespace {

// One ending after its context: the row's tokens and where the ending's targets start in it.
struct Row {
  size_t example;      // index into this rank's examples
  int ending;
  std::vector<int> tokens;  // context + ending, at most T + 1
  int first_target;         // targets[first_target..] are the ending's tokens
};

std::vector<Row> rows_of(const std::vector<const ChoiceExample*>& mine, int T) {
  std::vector<Row> rows;
  for (size_t i = 0; i < mine.size(); ++i) {
    const ChoiceExample& ex = *mine[i];
    for (int k = 0; k < int(ex.endings.size()); ++k) {
      Row r{i, k, ex.context, 0};
      r.tokens.insert(r.tokens.end(), ex.endings[k].begin(), ex.endings[k].end());
      // target j is token j + 1: the ending's first target is the context's last position
      r.first_target = int(ex.context.size()) - 1;
      const int drop = std::max(0, int(r.tokens.size()) - (T + 1));
      r.tokens.erase(r.tokens.begin(), r.tokens.begin() + drop);
      r.first_target = std::max(0, r.first_target - drop);
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

}  // namespace

ChoicePick pick_ending(const std::vector<double>& sums, const std::vector<int>& n) {
  ChoicePick p;
  for (int k = 1; k < int(sums.size()); ++k) {
    if (sums[k] < sums[p.by_sum]) p.by_sum = k;
    if (sums[k] / n[k] < sums[p.by_mean] / n[p.by_mean]) p.by_mean = k;
  }
  return p;
}

ChoiceAccuracy score_choices(const std::vector<ChoiceExample>& examples, GPT& model, ParamStore& ps, HostComm& host,
                             const std::function<bool()>& stop) {
  const int B = model.B(), T = model.T(), world = host.world(), rank = host.rank();
  std::vector<const ChoiceExample*> mine;
  std::vector<int64_t> rows_per_rank(world, 0);
  for (size_t i = 0; i < examples.size(); ++i) {
    rows_per_rank[i % world] += int64_t(examples[i].endings.size());
    if (int(i % world) == rank) mine.push_back(&examples[i]);
  }
  const int64_t most = *std::max_element(rows_per_rank.begin(), rows_per_rank.end());
  const std::vector<Row> rows = rows_of(mine, T);
  std::vector<std::vector<double>> sums(mine.size());
  std::vector<std::vector<int>> counts(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    sums[i].assign(mine[i]->endings.size(), 0.0);
    counts[i].assign(mine[i]->endings.size(), 0);
  }
  std::vector<int> tok(size_t(B) * T), tgt(size_t(B) * T);
  for (int64_t r0 = 0; r0 < most; r0 += B) {
    if (stop && stop()) {
      ChoiceAccuracy a;
      a.acc = a.acc_norm = NAN;
      a.stopped = true;
      return a;
    }
    std::fill(tok.begin(), tok.end(), 0);
    std::fill(tgt.begin(), tgt.end(), 0);
    for (int b = 0; b < B && r0 + b < int64_t(rows.size()); ++b) {
      const Row& r = rows[size_t(r0 + b)];
      const int len = int(r.tokens.size()) - 1;
      std::copy(r.tokens.begin(), r.tokens.begin() + len, tok.begin() + size_t(b) * T);
      std::copy(r.tokens.begin() + 1, r.tokens.end(), tgt.begin() + size_t(b) * T);
    }
    model.forward(ps, tok.data(), tgt.data(), false, 0.0f);
    const std::vector<float>& loss = model.token_losses();
    for (int b = 0; b < B && r0 + b < int64_t(rows.size()); ++b) {
      const Row& r = rows[size_t(r0 + b)];
      for (int t = r.first_target; t + 1 < int(r.tokens.size()); ++t) {
        sums[r.example][r.ending] += loss[size_t(b) * T + t];
        ++counts[r.example][r.ending];
      }
    }
  }
  double right = 0, right_norm = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    const ChoicePick p = pick_ending(sums[i], counts[i]);
    right += p.by_sum == mine[i]->label;
    right_norm += p.by_mean == mine[i]->label;
  }
  ChoiceAccuracy a;
  a.examples = int64_t(examples.size());
  if (a.examples == 0) return a;
  a.acc = host.sum(right) / double(a.examples);
  a.acc_norm = host.sum(right_norm) / double(a.examples);
  return a;
}

}  // namespace gpt
