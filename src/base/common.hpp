// Shared basics: dtypes, error types with exit codes, check macros.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "base/random.hpp"  // splitmix64

namespace gpt {

enum class DType : uint8_t { F32, BF16 };
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

// The names a key of enum type E reads and writes, in the enum's order (config/fields.hpp parses them).
// An enum that was a boolean key once also has `static constexpr bool bool_names = true`: it reads
// `false` and `true` as its first two names. The model's structural enums have theirs beside them, below;
// the other keys' are in config/config.hpp.
template <class E>
struct EnumNames;

// The normalisation of a model (model.norm): LayerNorm (GPT-2: mean and variance, weight and bias) or
// RMSNorm (root mean square only, weight only).
enum class NormKind : uint8_t { layernorm, rmsnorm };
template <> struct EnumNames<NormKind> { static constexpr const char* names[] = {"layernorm", "rmsnorm"}; };

// The MLP's activation (model.activation): GELU, tanh form (GPT-2's), or relu2, the squared ReLU
// max(x, 0)^2 (So et al., "Primer", 2021). Its math for every backend: base/activation.hpp.
enum class Activation : uint8_t { gelu, relu2 };
template <> struct EnumNames<Activation> { static constexpr const char* names[] = {"gelu", "relu2"}; };

// How the model knows positions (model.pos_embedding): none (NoPE: the causal mask alone), a learned
// embedding added to the tokens' (GPT-2's wpe), or rotary embeddings of the queries and keys (RoPE, Su et
// al. 2021, as GPT-NeoX and LLaMA rotate them: element i with element i + head_dim / 2). A boolean key
// once: false is none, true learned.
enum class PosEmbedding : uint8_t { none, learned, rope };
template <> struct EnumNames<PosEmbedding> {
  static constexpr const char* names[] = {"none", "learned", "rope"};
  static constexpr bool bool_names = true;
};

// Host-side conversions for files (llm.c bf16 models, safetensors): exact widening, and fp32 -> bf16
// rounded to nearest even.
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return uint16_t(u >> 16);  // inf and NaN as they are
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);  // IEEE half, subnormals included

// Exit statuses, documented in docs/FORMATS.md.
enum ExitCode : int {
  kExitOk = 0,
  kExitBadInput = 1,      // config, data or checkpoint problems
  kExitFailure = 2,       // training failure, dead rank, library error
  kExitOutOfMemory = 3,
  kExitCheckpointed = 75  // stopped by a signal after writing a checkpoint: resume me
};

// Every error the program reports carries the exit status it should end with.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad user input: a config key, a data file, a checkpoint.
inline Error input_error(const std::string& what) { return Error(kExitBadInput, what); }

// text -> path, through path.tmp and a rename: the file is whole or absent (input_error if it cannot be)
void write_file_whole(const std::string& path, const std::string& text);

[[noreturn]] void throw_check_failure(const char* lib, const char* call, const std::string& detail,
                                      const char* file, int line, ExitCode code = kExitFailure);

}  // namespace gpt
