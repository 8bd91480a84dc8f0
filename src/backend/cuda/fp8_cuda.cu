#include "backend/cuda/fp8_cuda.cuh"

#include "backend/cuda/kernel_boundary.cuh"
#include "kernels/classifier.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/matmul_fp8.cuh"

namespace gpt {

namespace {

using kern::bf16;

kern::Fp8Operand operand(const Fp8Tensor& t) { return {t.data, t.scale_inv, t.fmt}; }

class CudaFp8Products final : public Fp8Products {
 public:
  explicit CudaFp8Products(const CudaFp8Context& c) : c_(c) {}

  void cast(const Fp8Cast& op) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, fp8_cast_op_name(op));
    kern::Fp8CastArgs<bf16> a = cast_args(op.q, op.q_t, op.x, op.N, op.C);
    if (op.apply == Fp8Cast::Apply::act_grad)
      a.act = kern::fp8_cast_act(op.act, true), a.act_in = static_cast<const bf16*>(op.act_in);
    if (op.apply == Fp8Cast::Apply::act) a.act = kern::fp8_cast_act(op.act, false);
    a.colsum = op.colsum;
    if (op.colsum) a.scratch = static_cast<float*>(c_.scratch(kern::fp8_cast_scratch_bytes(op.N, op.C)));
    kernel_boundary([&] { kern::fp8_cast<bf16>(a, c_.stream); });
  }
  void quantize(const Fp8Quantize& op) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, "fp8_cast");
    kernel_boundary([&] {
      kern::fp8_quantize(static_cast<uint8_t*>(op.q.data), static_cast<const bf16*>(op.x), op.n, op.q.scale,
                         op.q.amax, op.q.fmt, c_.stream);
    });
  }
  void transpose(const Fp8Transpose& op) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, "fp8_transpose");
    kernel_boundary([&] {
      kern::fp8_transpose(static_cast<uint8_t*>(op.dst), static_cast<const uint8_t*>(op.src), op.N, op.C, c_.stream);
    });
  }
  void matmul_fwd(void* out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias, int N, int IC, int OC,
                  void* pre_gelu) override {
    OpProfiler::Scope t(*c_.prof, c_.stream,
                        c_.prof->enabled() ? matmul_op_name("matmul_fp8_fwd", IC, OC, pre_gelu ? " +gelu" : "") : "");
    kern::MatmulFp8FwdArgs a;
    a.out = out, a.inp = operand(inp), a.w = operand(w), a.bias = bias, a.N = N, a.IC = IC, a.OC = OC;
    a.pre_gelu = pre_gelu;
    kernel_boundary([&] { kern::matmul_fp8_fwd(*c_.lt, a, c_.stream); });
  }
  bool matmul_fwd_gelu_q(const Fp8Tensor& out, const Fp8Tensor& inp, const Fp8Tensor& w, const void* bias, int N,
                         int IC, int OC, void* pre_gelu) override {
    OpProfiler::Scope t(*c_.prof, c_.stream,
                        c_.prof->enabled() ? matmul_op_name("matmul_fp8_fwd", IC, OC, " +gelu fp8") : "");
    kern::MatmulFp8GeluQArgs a;
    a.out = out.data, a.out_fmt = out.fmt, a.out_scale = out.scale;
    a.amax_slot = static_cast<float*>(c_.scratch(sizeof(float)));  // cuBLASLt overwrites its amax: folded below
    a.inp = operand(inp), a.w = operand(w), a.bias = bias, a.pre_gelu = pre_gelu, a.N = N, a.IC = IC, a.OC = OC;
    bool done = false;
    kernel_boundary([&] {
      done = kern::matmul_fp8_fwd_gelu_q(*c_.lt, a, c_.stream);
      if (done && out.amax) kern::fp8_fold_amax(out.amax, a.amax_slot, c_.stream);
    });
    return done;
  }
  void matmul_dinp(void* dinp, const Fp8Tensor& dout, const Fp8Tensor& w_t, int N, int IC, int OC,
                   const void* pre_gelu) override {
    OpProfiler::Scope t(*c_.prof, c_.stream,
                        c_.prof->enabled() ? matmul_op_name("matmul_fp8_dinp", IC, OC, pre_gelu ? " +dgelu" : "") : "");
    kernel_boundary([&] {
      kern::matmul_fp8_dinp(*c_.lt, dinp, operand(dout), operand(w_t), N, IC, OC, pre_gelu,
                            fp8::fast_dinp(c_.fast_accum, OC), c_.stream);
    });
  }
  void matmul_dw(void* dw, const Fp8Tensor& dout_t, const Fp8Tensor& inp_t, int N, int IC, int OC) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, c_.prof->enabled() ? matmul_op_name("matmul_fp8_dw", IC, OC, "") : "");
    kernel_boundary([&] {
      kern::matmul_fp8_dw(*c_.lt, dw, operand(dout_t), operand(inp_t), N, IC, OC, c_.fast_accum == fp8::FastAccum::all,
                          c_.stream);
    });
  }
  void add_sums(void* dst, const float* sums, int n) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, "fp8_bias_grad");
    kernel_boundary([&] { kern::add_sums<bf16>(static_cast<bf16*>(dst), sums, n, c_.stream); });
  }
  void classifier(const void* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                  const Fp8Tensor& dlogits) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, "classifier_fp8");
    kern::ClassifierArgs<bf16> a;
    a.logits = const_cast<bf16*>(static_cast<const bf16*>(logits));  // only read with an FP8 gradient
    a.losses = losses, a.targets = targets, a.N = N, a.V = V, a.Vp = Vp, a.dloss = dloss;
    a.q.out = static_cast<uint8_t*>(dlogits.data), a.q.scale = dlogits.scale, a.q.amax = dlogits.amax;
    a.q.fmt = dlogits.fmt;
    kernel_boundary([&] { kern::classifier<bf16>(a, c_.stream); });
  }
  void update_scales(const Fp8UpdateScales& a) override {
    OpProfiler::Scope t(*c_.prof, c_.stream, "fp8_update_scales");
    kern::Fp8ScalesLaunch l;
    l.amax = a.amax, l.history = a.history, l.scale = a.scale, l.scale_inv = a.scale_inv, l.maxval = a.maxval;
    l.saturated = a.saturated, l.n = a.n, l.H = a.H, l.row = a.row, l.margin = a.margin;
    kernel_boundary([&] { kern::fp8_update_scales(l, c_.stream); });
  }

 private:
  // a cast of x (N, C) into q.data and/or q_t
  static kern::Fp8CastArgs<bf16> cast_args(const Fp8Tensor& q, void* q_t, const void* x, int N, int C) {
    kern::Fp8CastArgs<bf16> a;
    a.x = static_cast<const bf16*>(x);
    a.out = static_cast<uint8_t*>(q.data), a.out_t = static_cast<uint8_t*>(q_t);
    a.scale = q.scale, a.amax = q.amax, a.fmt = q.fmt, a.N = N, a.C = C;
    return a;
  }
  CudaFp8Context c_;
};

}  // namespace

std::unique_ptr<Fp8Products> make_cuda_fp8_products(const CudaFp8Context& c) {
  return std::make_unique<CudaFp8Products>(c);
}

}  // namespace gpt
