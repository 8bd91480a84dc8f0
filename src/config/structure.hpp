// The model's structural choices, listed once. A row is everything the trainer knows about a choice:
//   - the key model.<name>, a field of ModelConfig, with GPT-2's value as its default and `doc` as its
//     documentation (docs/CONFIG.md), and the same field of ModelDims;
//   - a checkpoint attribute, which a resume compares and names in its refusal (a file written before the
//     choice existed reads as GPT-2's value);
//   - its words on the plan's model line, shown whenever the value is not GPT-2's, or always when `always`:
//     a bool's `plan`; an enum's value's name, after `plan` when it is not nullptr;
//   - the GPT-2 file formats' refusal: a value other than GPT-2's is not written as an llm.c model file or a
//     Hugging Face GPT-2 folder, nor started from one, unless `hf` (the folder can hold it).
// What a choice changes in the model (its parameters, its ops) is the parameter table's and the layers'.
//
// X(type, name, GPT-2's value, plan, always, hf, doc); the type is bool or an enum with EnumNames.
#pragma once

#define GPT_MODEL_STRUCTURE(X)                                                                                      \
  X(NormKind, norm, NormKind::layernorm, nullptr, true, false,                                                     \
    "layernorm (GPT-2: mean and variance, weight and bias) / rmsnorm (root mean square, weight only: no bias "      \
    "tensors). Every norm of the model; rmsnorm models are not GPT-2 and are not written as llm.c or Hugging "      \
    "Face GPT-2 files")                                                                                             \
  X(Activation, activation, Activation::gelu, nullptr, false, false,                                               \
    "the MLP's activation: gelu (GPT-2's, tanh form) / relu2 (the squared ReLU, max(x, 0)^2, as Primer and "       \
    "modded-nanogpt; no fused cuBLASLt epilogue, so `training.fp8_gelu_epilogue` needs gelu). relu2 models "        \
    "are not GPT-2 and are not written as llm.c or Hugging Face GPT-2 files")                                      \
  X(bool, bias, true, "no biases", false, false,                                                                   \
    "bias vectors in the block's four products and in the norms (GPT-2's); `false`: none anywhere, the "            \
    "products' outputs and the norms' without an added vector (fewer parameters and no bias gradients). "          \
    "Models without them are not GPT-2 and are not written as llm.c or Hugging Face GPT-2 files")                  \
  X(bool, tied_head, true, "untied head", false, true,                                                             \
    "the lm head is the token embedding's matrix (GPT-2's tying); `false`: a matrix of its own (`lmhead`, "         \
    "padded vocabulary x width, initialised and decayed as the embedding), the embedding then a lookup only. "      \
    "Untied models are written as Hugging Face GPT-2 folders (tie_word_embeddings false, lm_head.weight), "         \
    "not as llm.c model files")                                                                                     \
  X(PosEmbedding, pos_embedding, PosEmbedding::learned, "positions", false, false,                                  \
    "how the model knows positions: learned (GPT-2's: the embedding `wpe`, max_seq_len x width, added to the "      \
    "tokens'; also `true`) / none (NoPE: the causal mask alone tells positions apart; also `false`) / rope "       \
    "(rotary embeddings: each head's queries and keys rotated by their position, element i with element i + "     \
    "head_dim / 2 at frequency 10000^(-2i / head_dim), as GPT-NeoX and LLaMA; no `wpe`). Models other than "      \
    "learned are not GPT-2 and are not written as llm.c or Hugging Face GPT-2 files")

// A row as a field with GPT-2's value as its initialiser (ModelConfig's and ModelDims')
#define GPT_STRUCTURE_FIELD(type, name, gpt2, ...) type name = gpt2;
