// Hugging Face GPT-2 model folders: config.json and model.safetensors, as transformers'
// GPT2LMHeadModel.from_pretrained reads them. Converted to and from the layer-major logical layout:
// HF's Conv1D weights are stored (in, out), the transpose of this trainer's (out, in); the vocabulary
// is unpadded (vocab_size rows); the lm head is tied to wte and not stored.
#pragma once
#include <string>
#include <vector>

#include "model/layout.hpp"

namespace gpt {

// True when `path` is a folder with a config.json (what model.init_from takes as a Hugging Face model).
bool is_hf_model_dir(const std::string& path);
// Writes dir/config.json and dir/model.safetensors (fp32, or bf16 rounded to nearest even).
void write_hf_model(const std::string& dir, const ParamLayout& layout, const std::vector<float>& logical, bool bf16);
// The whole logical parameter vector from a folder; the dimensions in its config.json must equal the
// layout's. Tensor names with or without the `transformer.` prefix (both are in use).
std::vector<float> read_hf_model(const std::string& dir, const ParamLayout& layout);

}  // namespace gpt
