// The activations and scratch buffers of a GPT (model/gpt.cpp allocates them; gpt_fp8.cpp uses them too).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "model/gpt.hpp"

namespace gpt {

struct GPT::Acts {
  void* encoded;                       // (B,T,C)
  std::vector<void*> ln1, qkv, atty, res2, ln2, fch, fch_gelu, res3;
  std::vector<float*> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
  void* lnf;                           // (B,T,C)
  float *lnf_mean, *lnf_rstd;          // (B,T)
  void* logits;                        // (chunk, Vp)
  float* losses;                       // (B,T)
  int *tokens, *targets;               // (B,T)
  void* scratch_c;                     // (B,T,C): attproj / fcproj outputs before the residual add
  // backward
  void *dres, *dlnf, *dtmp, *datty;    // (B,T,C)
  float* dres_colsum;                  // (C): column sums of dres, the next projection's bias gradient
  void* dbig;                          // (B,T,4C): dfch or dqkv (FP8: also the GELU output before its cast)
  // FP8 only
  std::vector<void*> atty_t, w8;       // (C,N) bytes; per layer 24 C^2 bytes (four weights, each transposed too)
  std::vector<std::pair<uint64_t, int64_t>> w8_key;  // what w8[l] was cast from: parameters version, scales
  void *q_in, *q_dout_t, *q_inp_t;     // (N,4C) bytes each: a product's row-major operand, transposes
  float* colsum_big;                   // (4C): bias gradient of fc / qkv
  std::vector<void*> owned;
};

}  // namespace gpt
