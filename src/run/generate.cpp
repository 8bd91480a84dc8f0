#include "run/generate.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace gpt {

namespace {

// Greedy at temperature 0, else a draw from softmax(logits / temperature).
int next_token(const std::vector<float>& logits, double temperature, std::mt19937_64& rng) {
  if (temperature <= 0) return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  for (size_t j = 0; j < p.size(); ++j) p[j] = std::exp((logits[j] - mx) / temperature);
  return std::discrete_distribution<int>(p.begin(), p.end())(rng);
}

}  // namespace

std::vector<int> generate(GPT& model, ParamStore& ps, std::vector<int> ids, int n, double temperature,
                          uint64_t seed, HostComm* host) {
  const int T = model.T();
  std::mt19937_64 rng(seed);
  std::vector<float> logits;
  std::vector<int> window(size_t(model.B()) * T, 0);
  for (int i = 0; i < n; ++i) {
    const int start = std::max(0, int(ids.size()) - T), len = int(ids.size()) - start;
    std::fill(window.begin(), window.end(), 0);
    std::copy(ids.begin() + start, ids.end(), window.begin());
    logits.resize(size_t(model.vocab_size()));
    model.logits_row(ps, window.data(), len - 1, logits.data());
    int tok = next_token(logits, temperature, rng);
    if (host && host->world() > 1) host->broadcast(&tok, sizeof tok, 0);
    ids.push_back(tok);
  }
  return ids;
}

}  // namespace gpt
