// The optimizers' own hyperparameters (besides lr and weight_decay), as their rules declare them
// (optim/rules.hpp, kHypers): each name is a config key training.<name> with its default, the values it
// accepts and its documentation. The config, its validation and make_optimizer read this table; a new rule's
// hyperparameter appears in all three by being declared.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace gpt {

using HyperValues = std::map<std::string, float>;  // name -> value

struct HyperInfo {
  std::string name;     // e.g. "beta1"
  std::string key;      // "training.beta1"
  float value = 0;      // the default
  float lo = 0, hi = 0; // accepted: lo <= x < hi, or lo < x < hi with lo_open
  bool lo_open = false;
  std::string doc;      // each rule's meaning of it, "`adamw`: ...; `lion`: ..."
  std::string requirement() const;  // "must be in [0, 1)", "must be > 0"
  bool accepts(float x) const;
};

// Every rule's hyperparameters, each name once, in the rules' order (a name two rules declare with
// different defaults is a programming error, thrown as std::logic_error on first use).
const std::vector<HyperInfo>& optimizer_hypers();
HyperValues default_hypers();

}  // namespace gpt
