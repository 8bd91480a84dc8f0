// Hugging Face GPT-2 model folders: config.json and model.safetensors, as transformers'
// GPT2LMHeadModel.from_pretrained reads them, with generation_config.json and, for a model on GPT-2's BPE
// vocabulary, the tokenizer files AutoTokenizer reads. Converted to and from the layer-major logical layout:
// HF's Conv1D weights are stored (in, out), the transpose of this trainer's (out, in); the vocabulary
// is unpadded (vocab_size rows); the lm head is tied to wte and not stored. config.json states the
// weights' type as `dtype` (transformers 4.56 and later) and `torch_dtype` (the name earlier versions read).
#pragma once
#include <string>
#include <vector>

#include "model/params.hpp"

namespace gpt {

// True when `path` is a folder with a config.json (what model.init_from takes as a Hugging Face model).
bool is_hf_model_dir(const std::string& path);
// Writes dir/config.json and dir/model.safetensors (fp32, or bf16 rounded to nearest even), and
// dir/generation_config.json when the vocabulary has GPT-2's <|endoftext|> (id 50256) to end on (else an
// earlier export's is removed), each file through a temporary file and a rename.
void write_hf_model(const std::string& dir, const ParamLayout& layout, const std::vector<float>& logical, bool bf16);

// Where a folder's tokenizer comes from: GPT-2's vocab.json and merges.txt (checked: they load, hold 50257
// tokens and <|endoftext|> is 50256) and `from`, what they were named by (the folder, or the two files), or
// none (empty paths) and `note` says why.
struct HfTokenizerSource {
  std::string vocab_json, merges_txt;
  std::string from;
  std::string note;
};
// Only a model of GPT-2's vocabulary size (50257) gets a tokenizer, and only from GPT-2's files, named as
// gpt2_vocab_files (io/bpe.hpp) has it (a folder, or vocab.json and merges.txt): `given_vocab` and
// `given_merges` (--vocab and --merges; an input error when they cannot serve) or else the run's eval.vocab
// and eval.merges (`run_vocab`, `run_merges`: a note when missing or unusable, since the export stands
// without them).
HfTokenizerSource hf_tokenizer_source(const ModelDims& dims, const std::string& given_vocab,
                                      const std::string& given_merges, const std::string& run_vocab,
                                      const std::string& run_merges);
// Copies vocab.json and merges.txt from src's two files into dir and writes tokenizer_config.json and
// special_tokens_map.json (GPT2Tokenizer, <|endoftext|> as bos, eos and unk).
void write_hf_tokenizer(const std::string& dir, const ModelDims& dims, const HfTokenizerSource& src);
// Removes the tokenizer files write_hf_tokenizer writes from dir (an earlier export's, not this model's).
void remove_hf_tokenizer(const std::string& dir);
// The whole logical parameter vector from a folder; the dimensions in its config.json must equal the
// layout's (check_hf_config), and every weight must be finite. Tensor names with or without the
// `transformer.` prefix (both are in use).
std::vector<float> read_hf_model(const std::string& dir, const ParamLayout& layout);
// The folder's config.json against the model's dimensions, without reading the weights: a JSON object
// (no key given twice), model_type "gpt2", n_layer, n_head, n_embd, vocab_size and n_positions integers
// equal to the model's, and nothing this trainer does not compute where transformers reads it (absent
// keys take transformers' GPT-2 defaults, which are this trainer's): activation_function GELU's tanh
// approximation, layer_norm_epsilon 1e-5, tie_word_embeddings true (the head is wte), n_inner null or
// 4 n_embd, attention scaled by 1/sqrt(head size) only; input errors name the file, the key and its value.
void check_hf_config(const std::string& dir, const ModelDims& dims);
// The whole folder checked as read_hf_model reads it, without keeping the weights.
void check_hf_model(const std::string& dir, const ModelDims& dims);

}  // namespace gpt
