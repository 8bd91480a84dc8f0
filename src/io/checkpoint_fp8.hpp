// FP8 scaling state in a checkpoint's rank file: named entries (group `fp8`: the tensors' `names`,
// their `scale` and `amax_history`, attributes `steps` and `history`), so that a model that scales more
// tensors still loads a checkpoint that scaled fewer. Checkpoints written before names existed hold one
// flat `fp8_state` vector in the old fixed order; it is read into names here.
#pragma once
#include <hdf5.h>

#include <string>

#include "model/fp8_scaling.hpp"

namespace gpt {

void write_fp8_state(hid_t file, const Fp8Scaling::State& s);
// Empty when the file has none (not an fp8 run); input_error naming `where` when it is damaged.
Fp8Scaling::State read_fp8_state(hid_t file, int n_layer, const std::string& where);

}  // namespace gpt
