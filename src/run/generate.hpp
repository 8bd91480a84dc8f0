// Text generation with the model: what `train sample` and the samples during training share.
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/comm.hpp"
#include "model/gpt.hpp"

namespace gpt {

// Extends ids by n tokens. Row 0 of the model's micro-batch holds the last T tokens (the other rows and
// the positions past the end are padding the causal mask keeps out), so a model of any shape serves.
// Temperature 0 is greedy, else each token is drawn from softmax(logits / temperature) by an rng seeded
// with seed. With host, rank 0's choice is broadcast: every rank feeds the same tokens, as the forward
// passes are collective under ZeRO-3.
std::vector<int> generate(GPT& model, ParamStore& ps, std::vector<int> ids, int n, double temperature,
                          uint64_t seed, HostComm* host = nullptr);

}  // namespace gpt
