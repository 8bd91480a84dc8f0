// Matrix products through cuBLASLt, and the deterministic bias gradient (matmul.cu). All matrices are
// row-major in the model; cuBLASLt is column-major, so a row-major (r, c) matrix is passed as a
// column-major (c, r) one (see matmul.cu). X is the activation dtype: float or bf16.
#pragma once
#include <cuda_runtime.h>
#include <library_types.h>

#include <array>
#include <cstddef>
#include <map>
#include <memory>

#include "common.cuh"

struct cublasLtContext;

namespace gpt::kern {

enum class Epilogue : int { None, Bias, GeluAux, GeluAuxBias, DGelu };

// D (m x n, column-major, ldd) = op(A) op(B) (+ D when accumulate) with an optional epilogue.
struct GemmArgs {
  bool transa = false, transb = false;
  int m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  void* D = nullptr;
  int ldd = 0;
  bool accumulate = false;
  Epilogue epi = Epilogue::None;
  const void* bias = nullptr;  // (m), Bias / GeluAuxBias
  void* aux = nullptr;         // GELU input: written by GeluAux*, read by DGelu; (m x n), ld aux_ld
  int aux_ld = 0;
  // FP8 operands (matmul_fp8.cu): their types (CUDA_R_8F_E4M3 / _E5M2; -1: the handle's dtype), the
  // dequantizing scales (device pointers), and fast accumulation (Hopper's FP8 path without the periodic
  // promotion to fp32: faster, for the forward product). FP8 needs transa and not transb.
  int a_type = -1, b_type = -1;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fast_accum = false;
  // An FP8 output (FP8 operands only): D's type (CUDA_R_8F_E4M3 / _E5M2; -1: the handle's dtype), the
  // quantizing scale D is multiplied by, and where cuBLASLt writes max |D| before the scaling (overwritten,
  // not folded). Bias and GELU's aux stay in the activation dtype.
  int d_type = -1;
  const float* d_scale = nullptr;
  float* d_amax = nullptr;
};

// Owns the cuBLASLt handle and one cached plan (descriptors + chosen algorithm) per shape and epilogue.
// The workspace belongs to the caller and must outlive this object.
// autotune: on a shape's first use, time the heuristic's candidates on the real operands, and for a big
// product, for up to search_s seconds, the configurations cuBLASLt accepts around them (tile, cluster
// shape, custom option), and keep the fastest (the choice can differ between runs); otherwise the
// heuristic's first choice (reproducible). The timing synchronises with the host, and for an
// accumulating product allocates a copy of its output (cudaMallocAsync), on that first use only.
class CublasLt {
 public:
  // dtype: the operands' type, CUDA_R_32F (TF32 tensor cores) or CUDA_R_16BF, fp32 accumulation either way.
  // search_s: seconds per big product for the configurations beyond the heuristic's (autotune only)
  CublasLt(cudaDataType_t dtype, void* workspace, size_t workspace_bytes, bool autotune, double search_s = 0);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;
  // false when cuBLASLt has no algorithm for this shape and epilogue (the caller falls back)
  bool gemm(const GemmArgs& g, cudaStream_t s);

 private:
  struct Plan;
  using Key = std::array<long long, 20>;
  cudaDataType_t dtype_;
  cublasLtContext* handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  bool autotune_;
  double search_s_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

struct MatmulFwdArgs {
  void* out = nullptr;         // (N, OC)
  const void* inp = nullptr;   // (N, IC)
  const void* w = nullptr;     // (OC, IC)
  const void* bias = nullptr;  // (OC) or null
  int N = 0, IC = 0, OC = 0;
  void* pre_gelu = nullptr;    // (N, OC) or null: out = gelu(pre_gelu)
};
struct MatmulBwdArgs {
  void* dinp = nullptr;          // (N, IC) overwritten, or null
  void* dw = nullptr;            // (OC, IC) accumulated
  void* dbias = nullptr;         // (OC) accumulated, or null
  const void* dout = nullptr;    // (N, OC)
  const void* inp = nullptr;     // (N, IC)
  const void* w = nullptr;       // (OC, IC)
  int N = 0, IC = 0, OC = 0;
  const void* pre_gelu = nullptr;  // (N, IC) or null: dinp *= gelu'(pre_gelu)
  const float* dout_colsum = nullptr;  // (OC) or null: the column sums of dout, already computed
  float* scratch = nullptr;      // bias_grad_scratch_bytes(N, OC, num_sms) bytes when dbias is set
                                 // and dout_colsum is not
  int num_sms = 0;
};
// Both throw KernelError(kUnsupported) when cuBLASLt has no algorithm for a product and no fallback is left.
template <class X>
void matmul_fwd(CublasLt& lt, const MatmulFwdArgs& a, cudaStream_t s);
template <class X>
void matmul_bwd(CublasLt& lt, const MatmulBwdArgs& a, cudaStream_t s);

// The bias gradient on its own: dbias (OC) += sum over rows of dout (N, OC); deterministic.
// scratch: bias_grad_scratch_bytes(N, OC, num_sms) bytes.
size_t bias_grad_scratch_bytes(int N, int OC, int num_sms);
template <class X>
void bias_grad(X* dbias, const X* dout, int N, int OC, float* scratch, int num_sms, cudaStream_t s);

}  // namespace gpt::kern
