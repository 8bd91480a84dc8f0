// FP8 products. In cuBLASLt's column-major terms (a row-major (r, c) matrix is a column-major (c, r) one),
// each is D = op_T(A) * B with both A and B K-major:
//   forward   out (N,OC)  = inp @ w^T          D (OC x N)  = op_T(w: IC x OC) * inp (IC x N)
//   dinp      (N,IC)      = dout @ w           D (IC x N)  = op_T(w_t: OC x IC) * dout (OC x N)
//   dw        (OC,IC)    += dout^T @ inp       D (IC x OC) = op_T(inp_t: N x IC) * dout_t (N x OC), + D
// The forward takes fast accumulation (as Transformer Engine does for its forward products); the
// gradients take it where the caller asks (training.fp8_fast_accum), else keep cuBLASLt's fp32 promotion.
// On an H200 the promotion costs the input gradients' products 12-17% of their time (GPT-2 124M and
// 1558M) and the weight gradients' nothing measurable.
#include <library_types.h>

#include "activation.cuh"
#include "matmul_fp8.cuh"

namespace gpt::kern {

namespace {
int lib_type(fp8::Format f) { return f == fp8::Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
GemmArgs fp8_gemm(const Fp8Operand& a, int lda, const Fp8Operand& b, int ldb, int m, int n, int k) {
  GemmArgs g;
  g.transa = true;
  g.m = m, g.n = n, g.k = k;
  g.A = a.data, g.lda = lda, g.a_type = lib_type(a.fmt), g.a_scale = a.scale_inv;
  g.B = b.data, g.ldb = ldb, g.b_type = lib_type(b.fmt), g.b_scale = b.scale_inv;
  return g;
}
KernelError no_algorithm(const char* product) {
  return KernelError(KernelError::Kind::kUnsupported, std::string("cuBLASLt: no FP8 algorithm for the ") + product +
                                                          " matmul");
}
}  // namespace

void matmul_fp8_fwd(CublasLt& lt, const MatmulFp8FwdArgs& a, cudaStream_t s) {
  GemmArgs g = fp8_gemm(a.w, a.IC, a.inp, a.IC, a.OC, a.N, a.IC);
  g.ldd = a.OC;
  g.bias = a.bias;
  g.fast_accum = true;
  if (a.pre_gelu) {
    GemmArgs f = g;
    f.D = a.out;
    f.epi = a.bias ? Epilogue::GeluAuxBias : Epilogue::GeluAux;
    f.aux = a.pre_gelu, f.aux_ld = a.OC;
    if (lt.gemm(f, s)) return;
    g.D = a.pre_gelu;  // no fused GELU for these types: the product, then GELU on its own
    g.epi = a.bias ? Epilogue::Bias : Epilogue::None;
    if (!lt.gemm(g, s)) throw no_algorithm("forward");
    gelu_fwd<bf16>(static_cast<bf16*>(a.out), static_cast<const bf16*>(a.pre_gelu), size_t(a.N) * a.OC, s);
    return;
  }
  g.D = a.out;
  g.epi = a.bias ? Epilogue::Bias : Epilogue::None;
  if (!lt.gemm(g, s)) throw no_algorithm("forward");
}

bool matmul_fp8_fwd_gelu_q(CublasLt& lt, const MatmulFp8GeluQArgs& a, cudaStream_t s) {
  GemmArgs g = fp8_gemm(a.w, a.IC, a.inp, a.IC, a.OC, a.N, a.IC);
  g.D = a.out, g.ldd = a.OC;
  g.d_type = lib_type(a.out_fmt), g.d_scale = a.out_scale, g.d_amax = a.amax_slot;
  g.bias = a.bias;
  g.fast_accum = true;
  g.epi = a.bias ? Epilogue::GeluAuxBias : Epilogue::GeluAux;
  g.aux = a.pre_gelu, g.aux_ld = a.OC;
  return lt.gemm(g, s);
}

void matmul_fp8_dinp(CublasLt& lt, void* dinp, const Fp8Operand& dout, const Fp8Operand& w_t, int N, int IC, int OC,
                     const void* pre_gelu, bool fast_accum, cudaStream_t s) {
  GemmArgs g = fp8_gemm(w_t, OC, dout, OC, IC, N, OC);
  g.D = dinp, g.ldd = IC;
  g.fast_accum = fast_accum;
  if (pre_gelu) {
    GemmArgs f = g;
    f.epi = Epilogue::DGelu;
    f.aux = const_cast<void*>(pre_gelu), f.aux_ld = IC;
    if (lt.gemm(f, s)) return;
  }
  if (!lt.gemm(g, s)) throw no_algorithm("dinp");
  if (pre_gelu) gelu_bwd_inplace<bf16>(static_cast<bf16*>(dinp), static_cast<const bf16*>(pre_gelu), size_t(N) * IC, s);
}

void matmul_fp8_dw(CublasLt& lt, void* dw, const Fp8Operand& dout_t, const Fp8Operand& inp_t, int N, int IC, int OC,
                   bool fast_accum, cudaStream_t s) {
  GemmArgs g = fp8_gemm(inp_t, N, dout_t, N, IC, OC, N);
  g.D = dw, g.ldd = IC;
  g.accumulate = true;
  g.fast_accum = fast_accum;
  if (!lt.gemm(g, s)) throw no_algorithm("dweight");
}

}  // namespace gpt::kern
