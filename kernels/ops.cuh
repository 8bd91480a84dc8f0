// Launchers of the hand-written kernels (kernels/*.cu). Each takes the stream it queues on; none
// allocates or synchronises with the host, except sum_squares, which is documented so.
// X is the activation dtype: float or bf16. Shapes are in the comments; row-major throughout.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace gpt::kern {

// ---- conversions.cu
void f32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t s);  // round to nearest even
void bf16_to_f32(float* dst, const bf16* src, size_t n, cudaStream_t s);
template <class X>
void add_inplace(X* dst, const X* src, size_t n, cudaStream_t s);  // dst (n) += src (n)

// ---- gelu.cu (tanh approximation)
template <class X>
void gelu_fwd(X* out, const X* inp, size_t n, cudaStream_t s);
template <class X>
void gelu_bwd_inplace(X* d, const X* pre_gelu, size_t n, cudaStream_t s);  // d *= gelu'(pre_gelu)

// ---- encoder.cu
template <class X>
void encoder_fwd(X* out, const int* tokens, const X* wte, const X* wpe, int B, int T, int C, cudaStream_t s);
template <class X>
struct EncoderBwdArgs {
  X* dwte = nullptr;          // (Vp, C) accumulated
  X* dwpe = nullptr;          // (maxT, C) accumulated
  const X* dout = nullptr;    // (B, T, C)
  const int* tokens = nullptr;  // (B, T)
  int B = 0, T = 0, C = 0;
  void* scratch = nullptr;    // encoder_bwd_scratch_bytes(B*T) bytes of device memory
};
size_t encoder_bwd_scratch_bytes(int n_tokens);
template <class X>
void encoder_bwd(const EncoderBwdArgs<X>& a, cudaStream_t s);

// ---- layernorm.cu (eps 1e-5)
template <class X>
struct LayerNormFwdArgs {
  X* out = nullptr;           // (N, C)
  float* mean = nullptr;      // (N), may be null
  float* rstd = nullptr;      // (N), may be null
  const X* inp = nullptr;     // (N, C); unused when residual is set
  X* residual = nullptr;      // (N, C): if set, residual = a + b is written and normalised
  const X* a = nullptr;
  const X* b = nullptr;
  const X* w = nullptr;       // (C)
  const X* bias = nullptr;    // (C)
  int N = 0, C = 0;
};
template <class X>
void layernorm_fwd(const LayerNormFwdArgs<X>& a, cudaStream_t s);
template <class X>
struct LayerNormBwdArgs {
  X* dinp = nullptr;          // (N, C) accumulated
  X* dw = nullptr;            // (C) accumulated
  X* db = nullptr;            // (C) accumulated
  const X* dout = nullptr;    // (N, C)
  const X* inp = nullptr;     // (N, C)
  const X* w = nullptr;       // (C)
  const float* mean = nullptr;  // (N)
  const float* rstd = nullptr;  // (N)
  int N = 0, C = 0;
  float* dinp_colsum = nullptr;  // (C) or null: overwritten with the column sums of dinp after the update
  float* scratch = nullptr;   // layernorm_bwd_scratch_bytes(N, C, num_sms) bytes
  int num_sms = 0;
};
size_t layernorm_bwd_scratch_bytes(int N, int C, int num_sms);
template <class X>
void layernorm_bwd(const LayerNormBwdArgs<X>& a, cudaStream_t s);

// ---- classifier.cu
template <class X>
struct ClassifierArgs {
  X* logits = nullptr;        // (N, Vp); overwritten by the gradient when dloss != 0
  float* losses = nullptr;    // (N)
  const int* targets = nullptr;  // (N)
  int N = 0, V = 0, Vp = 0;
  float dloss = 0;
};
template <class X>
void classifier(const ClassifierArgs<X>& a, cudaStream_t s);

// ---- adamw.cu
template <class X>
struct AdamWLaunch {
  X* param = nullptr;         // (n)
  float* master = nullptr;    // (n) or null: then param is read, updated and written back
  const X* grad = nullptr;    // (n)
  float* m = nullptr;         // (n)
  float* v = nullptr;         // (n)
  size_t n = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_scale = 1;
  float bc1 = 1, bc2 = 1;     // 1 - beta^step
  uint64_t seed = 0;
  uint64_t index_offset = 0;  // logical index of element 0: rounding is the same however the tensor is split
  bool stochastic = true;     // bf16 params: stochastic rounding (seed ^ index) instead of nearest
};
template <class X>
void adamw(const AdamWLaunch<X>& a, cudaStream_t s);

// ---- sum_squares.cu: result (one double) written to device memory *out
size_t sum_squares_scratch_bytes();
template <class X>
void sum_squares(double* out, const X* x, size_t n, void* scratch, cudaStream_t s);

// ---- bias gradient (matmul.cu): dbias (OC) += sum over rows of dout (N, OC); deterministic
size_t bias_grad_scratch_bytes(int N, int OC, int num_sms);
template <class X>
void bias_grad(X* dbias, const X* dout, int N, int OC, float* scratch, int num_sms, cudaStream_t s);

}  // namespace gpt::kern
