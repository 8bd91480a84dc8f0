// llm.c model files (tensor-major, fp32 or bf16; format in docs/FORMATS.md), converted to and from
// this project's layer-major logical layout.
#pragma once
#include <string>
#include <vector>

#include "model/gpt.hpp"

namespace gpt {

// The whole logical parameter vector (ParamLayout::total() floats), from an llm.c file or a Hugging Face
// GPT-2 folder (io/hf.hpp). Throws a named input error if the file's dimensions differ from the layout's.
std::vector<float> read_model_file(const std::string& path, const ParamLayout& layout);
void write_model_file(const std::string& path, const ParamLayout& layout, const std::vector<float>& logical,
                      bool bf16);

}  // namespace gpt
