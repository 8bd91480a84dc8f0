// llm.c model files (tensor-major, fp32 or bf16; format in docs/FORMATS.md), converted to and from
// this project's layer-major logical layout.
#pragma once
#include <string>
#include <vector>

#include "model/gpt.hpp"

namespace gpt {

// The whole logical parameter vector (ParamLayout::total() floats), from an llm.c file or a Hugging Face
// GPT-2 folder (io/hf.hpp). Throws a named input error if the file's dimensions differ from the layout's
// or a weight is not finite (naming the tensor).
std::vector<float> read_model_file(const std::string& path, const ParamLayout& layout);
// The whole file checked as read_model_file reads it (the header or config.json against the model's
// dimensions, every tensor there, every weight finite) without keeping it: what set-up and a dry run
// check before any work.
void check_model_file(const std::string& path, const ModelDims& dims);
void write_model_file(const std::string& path, const ParamLayout& layout, const std::vector<float>& logical,
                      bool bf16);

}  // namespace gpt
