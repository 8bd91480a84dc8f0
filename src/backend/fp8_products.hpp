// A backend's FP8 ops inside it: the FP8 descriptors' ops (backend/fp8_ops.hpp), the products behind
// Backend::matmul_fwd and matmul_bwd (their FP8 operands; backend.hpp) and the classifier's loss with its
// FP8 gradient (Backend::classifier's dlogits). Each backend implements them once, and only its dispatch
// calls them.
#pragma once
#include "backend/backend.hpp"
#include "backend/fp8_ops.hpp"
#include "base/activation.hpp"

namespace gpt {

class Fp8Products {
 public:
  virtual ~Fp8Products() = default;
  // The descriptors' ops (Backend::fp8_cast, ...), checked by the dispatch below
  virtual void cast(const Fp8Cast& op) = 0;
  virtual void quantize(const Fp8Quantize& op) = 0;
  virtual void transpose(const Fp8Transpose& op) = 0;
  virtual void update_scales(const Fp8UpdateScales& op) = 0;
  // out (N, OC) = inp (N, IC) @ w (OC, IC)^T + bias (OC, nullable), fp32 accumulation, act dtype out.
  // With pre_gelu non-null: pre_gelu = that product, out = gelu_tanh(pre_gelu).
  virtual void matmul_fwd(void* out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias, int N, int IC,
                          int OC, void* pre_gelu) = 0;
  // The forward with GELU whose output goes to the next product in FP8: out.data (N, OC) =
  // fp8(gelu_tanh(inp @ w^T + bias) * out.scale), GELU computed from the fp32 product, max |gelu| folded
  // into *out.amax (nullable); pre_gelu (N, OC) = the product before GELU, act dtype. false: the backend
  // has no such fused product and wrote nothing (the caller takes matmul_fwd, then cast).
  virtual bool matmul_fwd_gelu_q(const Fp8Tensor& out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias,
                                 int N, int IC, int OC, void* pre_gelu) = 0;
  // dinp (N, IC) = dout (N, OC) @ w, from w_t = w transposed (IC, OC); overwrites. With pre_gelu (N, IC)
  // non-null it is multiplied by gelu_tanh'(pre_gelu) (a fused epilogue where the library has one).
  virtual void matmul_dinp(void* dinp, const Fp8Tensor& dout, const Fp8Tensor& w_t, int N, int IC, int OC,
                           const void* pre_gelu) = 0;
  // dw (OC, IC) += dout^T @ inp, from dout_t (OC, N) and inp_t (IC, N)
  virtual void matmul_dw(void* dw, const Fp8Tensor& dout_t, const Fp8Tensor& inp_t, int N, int IC, int OC) = 0;
  // dst (n, act dtype) += sums (n, fp32)
  virtual void add_sums(void* dst, const float* sums, int n) = 0;
  // Backend::classifier with the gradient in FP8 (dlogits): losses (N) fp32 = -log p[target] over logits (N, Vp)
  // of which the first V columns are real; the gradient (p - onehot(target)) * dloss (padded columns 0)
  // is quantized into dlogits.data (N, Vp) in the same pass, its amax recorded, always (zeros for
  // dloss = 0). The logits are only read.
  virtual void classifier(const void* logits, float* losses, const int* targets, int N, int V, int Vp,
                          float dloss, const Fp8Tensor& dlogits) = 0;
};

// A backend that owns FP8 products shows them to its op tests (tests/cpu/test_fp8.cpp, tests/gpu/test_fp8.cpp),
// which check them below the dispatch; nothing else reaches them but through Backend's ops.
class Fp8ProductsOwner {
 public:
  virtual Fp8Products* fp8_products() = 0;

 protected:
  ~Fp8ProductsOwner() = default;
};
inline Fp8Products& fp8_products(Backend& b) {
  auto* owner = dynamic_cast<Fp8ProductsOwner*>(&b);
  if (!owner || !owner->fp8_products())
    throw Error(kExitFailure, "internal error: " + b.name() + " has no FP8 products");
  return *owner->fp8_products();
}

// A backend's products and loss on FP8 operands, the same for every backend (f: the backend's FP8 products,
// null where it has none). Each returns false where the op is on values (the backend's own path), else runs
// it: the fused GELU output where the backend has it (else the product into op.out and a cast), the input
// and weight gradients, the bias gradient from the column sums, the loss with its FP8 gradient.
inline Fp8Products& fp8_products_of(Fp8Products* f) {
  if (!f) throw Error(kExitFailure, "internal error: an FP8 op on a backend without FP8 products");
  return *f;
}
// A cast's name in the op profile: "fp8_cast", "fp8_cast +gelu" (the activation applied), "fp8_cast +dgelu"
// (its derivative), "fp8_cast +dbias" (column sums only)
inline const char* fp8_cast_op_name(const Fp8Cast& op) {
  if (op.apply == Fp8Cast::Apply::act) return activation_op_names(op.act).cast;
  if (op.apply == Fp8Cast::Apply::act_grad) return activation_op_names(op.act).cast_grad;
  return op.colsum ? "fp8_cast +dbias" : "fp8_cast";
}
inline void fp8_cast(Fp8Products* products, const Fp8Cast& op) {
  if (const char* why = op.invalid(); *why)
    throw Error(kExitFailure, std::string("internal error: an FP8 cast with ") + why);
  fp8_products_of(products).cast(op);
}
inline bool fp8_matmul_fwd(Fp8Products* products, const MatmulFwd& op) {
  if (!op.inp.fp8() && !op.w.fp8()) {
    if (op.out_q.data) throw Error(kExitFailure, "internal error: an FP8 output of a product on values");
    return false;
  }
  Fp8Products& f = fp8_products_of(products);
  if (!op.inp.fp8() || !op.w.fp8()) throw Error(kExitFailure, "internal error: a product of FP8 and value operands");
  if (!op.out_q.data) {
    f.matmul_fwd(op.out, op.inp.q, op.w.q, op.bias, op.N, op.IC, op.OC, op.pre_gelu);
    return true;
  }
  if (!op.pre_gelu) throw Error(kExitFailure, "internal error: an FP8 product's FP8 output needs GELU");
  if (f.matmul_fwd_gelu_q(op.out_q, op.inp.q, op.w.q, op.bias, op.N, op.IC, op.OC, op.pre_gelu)) return true;
  f.matmul_fwd(op.out, op.inp.q, op.w.q, op.bias, op.N, op.IC, op.OC, op.pre_gelu);
  Fp8Cast cast;
  cast.q = op.out_q, cast.x = op.out, cast.N = op.N, cast.C = op.OC;
  fp8_cast(products, cast);
  return true;
}
inline bool fp8_matmul_bwd(Fp8Products* products, const MatmulBwd& op) {
  if (!op.dout.fp8() && !op.w.fp8() && !op.inp.fp8()) return false;
  Fp8Products& f = fp8_products_of(products);
  if ((op.dinp && (!op.dout.fp8() || !op.w.fp8())) || (op.dw && (!op.dout_t.data || !op.inp.fp8())))
    throw Error(kExitFailure, "internal error: a product of FP8 and value operands");
  if (op.pre_gelu) throw Error(kExitFailure, "internal error: an FP8 product leaves GELU's derivative to the cast");
  if (op.dbias && !op.dout_colsum) throw Error(kExitFailure, "internal error: an FP8 bias gradient needs dout's column sums");
  if (op.dinp) f.matmul_dinp(op.dinp, op.dout.q, op.w.q, op.N, op.IC, op.OC, nullptr);
  if (op.dw) f.matmul_dw(op.dw, op.dout_t, op.inp.q, op.N, op.IC, op.OC);
  if (op.dbias) f.add_sums(op.dbias, op.dout_colsum, op.OC);
  return true;
}
inline bool fp8_classifier(Fp8Products* products, const ClassifierLoss& op) {
  if (!op.dlogits.data) return false;
  fp8_products_of(products).classifier(op.logits, op.losses, op.targets, op.N, op.V, op.Vp, op.dloss, op.dlogits);
  return true;
}

}  // namespace gpt
