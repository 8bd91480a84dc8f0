// The compute backend: a short list of ops the model is written in, implemented once for the CPU
// (fp32, OpenMP + BLAS; the reference) and once for CUDA (bf16 or fp32; cuBLASLt, cuDNN, own kernels).
//
// Conventions for every op:
// - Pointers are device pointers of this backend (host memory for the CPU backend).
// - `void*` tensors hold the backend's activation dtype `act_dtype()` (fp32 on CPU; bf16 on CUDA unless
//   precision is fp32). `float*` tensors are always fp32, `int*` always int32.
// - Shapes are row-major; weights are (out, in) as in PyTorch's nn.Linear.
// - Ops documented "accumulates" add into their output (+=); the others overwrite it.
// - Ops are asynchronous on the CUDA backend (one compute stream) and ordered; a host read
//   (`copy_d2h`, `grad_norm_sq`) synchronises.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/common.hpp"
#include "backend/fp8_ops.hpp"

namespace gpt {

// What a backend is built with: chosen once by the run's plan (run/plan.hpp), never the whole Config.
struct BackendOptions {
  DType act = DType::F32;           // activation dtype: bf16 or fp32 on CUDA; the CPU backend is always fp32
  int local_rank = 0;               // which GPU of the node (one GPU per local rank)
  bool deterministic = false;       // bit-reproducible GPU steps at some speed
  fp8::FastAccum fp8_fast_accum = fp8::FastAccum::dinp;  // FP8 products summed fast (base/fp8_math.hpp)
  double matmul_search_s = 0;       // seconds a matmul's cuBLASLt configurations may be timed on first use
  bool op_profile = false;          // time every op (log.op_profile)
};

// The CUDA backend's own device memory beside what the model allocates (run/plan.cpp predicts it):
// cuBLASLt's workspace, and one scratch buffer the kernels share, grown in steps of kCudaScratchStep (one
// step holds every kernel's scratch at GPT-2's shapes). cuDNN's attention workspace: cudnn_attention_bytes.
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // what cuBLASLt asks for on Hopper
inline constexpr size_t kCudaScratchStep = size_t(8) << 20;
// cuDNN's attention backward for N rows of NH heads and C = NH x HS features: an fp32 dQ accumulator (N, C)
// and one fp32 per row and head (as measured with the cuDNN 9 of torch 2.11's wheels, bench/RESULTS.md)
inline size_t cudnn_attention_bytes(size_t N, int C, int NH) { return N * (size_t(C) + size_t(NH)) * 4; }

// A normalisation forward over rows of C features, eps 1e-5: x = a, or with b non-null residual = a + b
// (written) and x = residual; then
//   layernorm: y = (x - mean(x)) * rstd * w + bias, rstd = 1 / sqrt(var(x) + eps)  (bias nullable: none)
//   rmsnorm:   y = x * rstd * w,                    rstd = 1 / sqrt(mean(x^2) + eps)  (mean, bias unused)
// mean, rstd (N) fp32, kept for the backward (mean nullable for rmsnorm). y goes to `out` in the
// activation dtype, or with q.data non-null into q.data (N, C) as FP8 with q's scale (max |y| folded into
// *q.amax): the input of an FP8 product, written by the norm itself.
struct NormFwd {
  NormKind kind = NormKind::layernorm;
  void* out = nullptr;
  Fp8Tensor q;
  float* mean = nullptr;
  float* rstd = nullptr;
  void* residual = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  int N = 0, C = 0;
};
// Its backward from the forward's input x (inp) and statistics: accumulates dinp (N, C), dw (C) and db
// (C; nullable: no bias, as rmsnorm has none). With dinp_colsum (C, fp32) non-null it is overwritten with
// the column sums of dinp after the update: the bias gradient of the product that wrote the residual stream
// here (passed on to that product's matmul_bwd as dout_colsum).
struct NormBwd {
  NormKind kind = NormKind::layernorm;
  void* dinp = nullptr;
  void* dw = nullptr;
  void* db = nullptr;
  const void* dout = nullptr;
  const void* inp = nullptr;
  const void* w = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  int N = 0, C = 0;
  float* dinp_colsum = nullptr;
};

// GPT-2's normal initialisation: dst (n) fp32, dst[i] = float(normal_init_value(seed, index + i, std))
// (base/random.hpp): the same bits on every backend, whatever the split of a tensor into calls.
struct NormalInit {
  float* dst = nullptr;
  size_t n = 0;
  uint64_t seed = 0, index = 0;
  float std = 0;
};

// A conversion of n values between fp32 and the activation dtype: to_act rounds fp32 to nearest (a copy
// where the activation dtype is fp32), else widens back to fp32.
struct Convert {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t n = 0;
  bool to_act = true;
};

// dst (n) += src (n), activation dtype.
struct AddInplace {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t n = 0;
};

// The MLP's activation (base/activation.hpp; GELU in its tanh form): out (n) = act(inp), activation dtype
struct ActivationFwd {
  void* out = nullptr;
  const void* inp = nullptr;
  size_t n = 0;
  Activation act = Activation::gelu;
};
// Its derivative applied in place: d (n) *= act'(pre) (pre: the activation's input), activation dtype
struct ActivationBwd {
  void* d = nullptr;
  const void* pre = nullptr;
  size_t n = 0;
  Activation act = Activation::gelu;
};

// The sum of squares of x (n, activation dtype) in double: queued into *out (one double of the backend's
// memory) where out is given, else returned to the host (synchronising).
struct SumSquares {
  const void* x = nullptr;
  size_t n = 0;
  double* out = nullptr;
};

// An operand of a product: values `x` in the activation dtype, or FP8 bytes (q.data non-null, dequantized
// with q.scale_inv; backend/fp8_ops.hpp's conventions). A product takes all of its operands one way: FP8
// ones run on the FP8 tensor cores (training.precision fp8), values on the activation dtype's.
struct Operand {
  const void* x = nullptr;
  Fp8Tensor q;
  bool fp8() const { return q.data != nullptr; }
};
inline Operand values(const void* x) {
  Operand o;
  o.x = x;
  return o;
}
inline Operand fp8_bytes(const Fp8Tensor& q) {
  Operand o;
  o.q = q;
  return o;
}

// A product's forward: out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias (OC, nullable), fp32 accumulation,
// out in the activation dtype. With pre_gelu non-null: pre_gelu = that product, out = act(pre_gelu) (a
// fused epilogue for GELU; any other activation: the product, then activation_fwd). FP8 operands may
// also take out_q (out_q.data non-null, with pre_gelu and GELU): GELU's output goes to the next product as
// FP8, out_q.data = fp8(gelu * out_q.scale), max |gelu| folded into *out_q.amax, `out` then scratch
// (N, OC) that a backend without the fused product writes on the way.
struct MatmulFwd {
  void* out = nullptr;
  Fp8Tensor out_q;
  Operand inp, w;
  const void* bias = nullptr;
  void* pre_gelu = nullptr;
  Activation act = Activation::gelu;  // what pre_gelu's activation is
  int N = 0, IC = 0, OC = 0;
};
// A product's backward, for out = inp @ w^T + bias: dinp (N,IC) = dout @ w, overwritten (nullable:
// skipped), with pre_gelu (N,IC; values only) non-null multiplied by act'(pre_gelu) (GELU: in the
// epilogue; any other activation: activation_bwd after the product); dw (OC,IC) +=
// dout^T @ inp (nullable: skipped); dbias (OC, nullable) += the column sums of dout, taken from
// dout_colsum (OC, fp32) where the op that wrote dout summed them (FP8 operands: always).
// Values: dout (N,OC), inp (N,IC), w (OC,IC). FP8 operands come as the tensor cores take them (K-major):
// dout (N,OC) and w transposed (IC,OC) for dinp; dout_t (OC,N) and inp transposed (IC,N) for dw.
struct MatmulBwd {
  void* dinp = nullptr;
  void* dw = nullptr;
  void* dbias = nullptr;
  Operand dout, inp, w;
  Fp8Tensor dout_t;
  const void* pre_gelu = nullptr;
  Activation act = Activation::gelu;  // what pre_gelu's activation is
  const float* dout_colsum = nullptr;
  int N = 0, IC = 0, OC = 0;
};

// Fused softmax + cross-entropy over logits (N,Vp) of which the first V columns are real: losses (N) fp32
// = -log p[target]. With dloss != 0 the gradient (p - onehot(target)) * dloss (padded columns 0) is written
// over the logits; or, with dlogits.data non-null (FP8, the classifier's FP8 products), quantized into
// dlogits (N,Vp) in the same pass with its amax recorded, always (zeros for dloss = 0), the logits only read.
struct ClassifierLoss {
  void* logits = nullptr;
  float* losses = nullptr;
  const int* targets = nullptr;
  int N = 0, V = 0, Vp = 0;
  float dloss = 0;
  Fp8Tensor dlogits;
};

// The embeddings: out (B,T,C) = wte[tokens] + wpe[t]; tokens (B,T); wte (Vp,C); wpe (maxT,C), or nullptr: none
struct EncoderFwd {
  void* out = nullptr;
  const int* tokens = nullptr;
  const void* wte = nullptr;
  const void* wpe = nullptr;
  int B = 0, T = 0, C = 0;
};
// Their backward: accumulates dwte (Vp,C), dwpe (maxT,C; nullptr without wpe) from dout (B,T,C); deterministic on
// every backend
struct EncoderBwd {
  void* dwte = nullptr;
  void* dwpe = nullptr;
  const void* dout = nullptr;
  const int* tokens = nullptr;
  int B = 0, T = 0, C = 0;
};
// Rotary position embedding (model.pos_embedding: rope; the math: base/rope.hpp), in place on qkv
// (B,T,3,NH,HS): every head's q and k at position t rotated pairwise (i with i + HS/2) by t's angles, v
// untouched; `inverse`: by the negative angles, the backward of the forward's rotation (on dqkv).
struct Rope {
  void* qkv = nullptr;
  int B = 0, T = 0, NH = 0, HS = 0;
  bool inverse = false;
};
// Causal self-attention: qkv (B,T,3,NH,HS); out (B,T,NH,HS); lse (B,NH,T) fp32 log-sum-exp of the scaled
// scores (softmax scale 1/sqrt(HS)), kept for the backward.
struct AttentionFwd {
  void* out = nullptr;
  float* lse = nullptr;
  const void* qkv = nullptr;
  int B = 0, T = 0, NH = 0, HS = 0;
};
// Its backward: dqkv (B,T,3,NH,HS) overwritten from dout (B,T,NH,HS) and the forward's qkv, out and lse
struct AttentionBwd {
  void* dqkv = nullptr;
  const void* dout = nullptr;
  const void* qkv = nullptr;
  const void* out = nullptr;
  const float* lse = nullptr;
  int B = 0, T = 0, NH = 0, HS = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;          // "cpu" or "cuda"
  virtual std::string hardware() const = 0;      // e.g. "NVIDIA H200" or "cpu: 2 threads"
  virtual DType act_dtype() const = 0;
  virtual double peak_flops() const = 0;         // per device, for MFU; 0 when unknown

  // ---- memory
  virtual void* alloc(size_t bytes) = 0;         // throws Error(kExitOutOfMemory) naming the bytes
  virtual void free(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy_h2d(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_d2h(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_d2d(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  virtual size_t bytes_in_use() const = 0;       // allocated through this backend now
  virtual size_t peak_bytes() const = 0;         // peak device memory (CPU: peak RSS since construction)
  // what the process held before this backend allocated anything (CPU: its resident set then, which
  // peak_bytes includes; GPU: 0, peak_bytes being the backend's own tally)
  virtual size_t baseline_bytes() const { return 0; }
  virtual void reset_peak() = 0;
  virtual void* stream() { return nullptr; }     // cudaStream_t of the compute stream, if any
  // Background copies to host memory (checkpoint snapshots). pin_host page-locks [p, p+bytes) of host
  // memory so that copies into it run at the bus's speed without the host's help; false where it could
  // not (the copies still work, slower). unpin_host undoes it before the memory is freed.
  virtual bool pin_host(void* p, size_t bytes) { return true; }
  virtual void unpin_host(void* p) {}
  // Queues a copy of device memory into host memory, ordered after every op queued so far and run
  // beside the ops queued after it (CUDA: on a copy stream; CPU: copied now).
  virtual void copy_d2h_async(void* dst, const void* src, size_t bytes) { copy_d2h(dst, src, bytes); }
  // Ops queued from now on run after every copy_d2h_async queued so far: a write to a copy's source
  // waits for the copy on the device, not on the host.
  virtual void after_copies() {}
  // Blocks the calling thread (any thread) until every copy_d2h_async queued so far has landed.
  virtual void wait_copies() {}
  // An optimizer on the host (training.offload). download queues a copy of device memory into host
  // memory behind every op queued so far (CUDA: on the copy stream, beside the ops queued after it) and
  // returns a ticket that wait_download blocks on until that copy has landed (tickets of the last 64
  // downloads). upload queues a copy of host memory into device memory on the compute stream: the ops
  // queued after it see it; the host memory must stay as it is until they run (the CPU copies both now).
  virtual uint64_t download(void* dst, const void* src, size_t bytes) {
    copy_d2h(dst, src, bytes);
    return 0;
  }
  virtual void wait_download(uint64_t ticket) {}
  virtual void upload(void* dst, const void* src, size_t bytes) { copy_h2d(dst, src, bytes); }
  // log.op_profile: each op's GPU time per step since the last reset, as a table ("" when off or none)
  virtual std::string op_profile() const { return ""; }
  virtual void op_profile_reset() {}
  virtual void op_profile_pause(bool paused) {}  // ops queued while paused are not timed

  // ---- conversions and elementwise
  virtual void convert(const Convert& op) = 0;
  virtual void add_inplace(const AddInplace& op) = 0;
  // The same, the arguments in a row
  void f32_to_act(void* dst, const float* src, size_t n) { convert(Convert{dst, src, n, true}); }  // round to nearest
  void act_to_f32(float* dst, const void* src, size_t n) { convert(Convert{dst, src, n, false}); }
  void add_inplace(void* dst, const void* src, size_t n) { add_inplace(AddInplace{dst, src, n}); }  // dst += src

  // ---- model ops
  // The embeddings (EncoderFwd, EncoderBwd above)
  virtual void encoder_fwd(const EncoderFwd& op) = 0;
  virtual void encoder_bwd(const EncoderBwd& op) = 0;
  // The normalisations (NormFwd, NormBwd above); `supports` says why a backend cannot run one ("" when it can)
  virtual void norm_fwd(const NormFwd& op) = 0;
  virtual void norm_bwd(const NormBwd& op) = 0;
  virtual std::string supports(const NormFwd& op) const { return ""; }
  // The products (MatmulFwd, MatmulBwd above), on values or FP8 operands
  virtual void matmul_fwd(const MatmulFwd& op) = 0;
  virtual void matmul_bwd(const MatmulBwd& op) = 0;
  // The same on values, the arguments in a row (the descriptors' fields)
  void matmul_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC, void* pre_gelu) {
    MatmulFwd op;
    op.out = out, op.inp = values(inp), op.w = values(w), op.bias = bias, op.pre_gelu = pre_gelu;
    op.N = N, op.IC = IC, op.OC = OC;
    matmul_fwd(op);
  }
  void matmul_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, int N, int IC,
                  int OC, const void* pre_gelu, const float* dout_colsum) {
    MatmulBwd op;
    op.dinp = dinp, op.dw = dw, op.dbias = dbias, op.dout = values(dout), op.inp = values(inp), op.w = values(w);
    op.pre_gelu = pre_gelu, op.dout_colsum = dout_colsum, op.N = N, op.IC = IC, op.OC = OC;
    matmul_bwd(op);
  }
  // Causal self-attention (AttentionFwd, AttentionBwd above)
  virtual void attention_fwd(const AttentionFwd& op) = 0;
  virtual void attention_bwd(const AttentionBwd& op) = 0;
  virtual void rope(const Rope& op) = 0;
  // The activation where no product's epilogue applies it, and its derivative (ActivationFwd/Bwd above)
  virtual void activation_fwd(const ActivationFwd& op) = 0;
  virtual void activation_bwd(const ActivationBwd& op) = 0;
  // The loss and its gradient (ClassifierLoss above); the positional form: the gradient over the logits
  virtual void classifier(const ClassifierLoss& op) = 0;
  void classifier(void* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss) {
    ClassifierLoss op;
    op.logits = logits, op.losses = losses, op.targets = targets, op.N = N, op.V = V, op.Vp = Vp, op.dloss = dloss;
    classifier(op);
  }
  virtual void normal_init(const NormalInit& op) = 0;
  // A sum of squares (SumSquares above): queued into op.out, or returned (0 when queued)
  virtual double sum_squares(const SumSquares& op) = 0;
  // Device code that lives outside the backend (an optimizer's update, optim/step.hpp): fn runs with the
  // compute stream (cudaStream_t; nullptr on the CPU), queued after every op so far, timed as op `name`
  // by the op profile, and its kernels' failures turned into the program's errors like the ops' own.
  virtual void run_op(const char* name, const std::function<void(void* stream)>& fn) = 0;

  // ---- FP8 (backend/fp8_ops.hpp's descriptors): why this backend runs no FP8 op ("" when it does: the
  // CPU's emulation, and CUDA in bf16 on FP8 tensor cores), then the ops, which throw where it runs none
  virtual std::string supports_fp8() const { return "the " + name() + " backend has no FP8 ops"; }
  virtual void fp8_cast(const Fp8Cast& op) = 0;
  virtual void fp8_quantize(const Fp8Quantize& op) = 0;
  virtual void fp8_transpose(const Fp8Transpose& op) = 0;
  virtual void fp8_update_scales(const Fp8UpdateScales& op) = 0;
};

// A product whose activation no epilogue applies (every one but GELU), on any backend and operands: the
// product into pre_gelu, then activation_fwd; the input gradient's product, then activation_bwd. Each
// returns false where the product's own path applies it (GELU, or no activation), else has run the op.
inline bool matmul_fwd_unfused(Backend& be, const MatmulFwd& op) {
  if (!op.pre_gelu || op.act == Activation::gelu) return false;
  if (op.out_q.data) throw Error(kExitFailure, "internal error: an FP8 output of an activation other than GELU");
  MatmulFwd product = op;
  product.out = op.pre_gelu, product.pre_gelu = nullptr;
  be.matmul_fwd(product);
  be.activation_fwd(ActivationFwd{op.out, op.pre_gelu, size_t(op.N) * op.OC, op.act});
  return true;
}
inline bool matmul_bwd_unfused(Backend& be, const MatmulBwd& op) {
  if (!op.pre_gelu || op.act == Activation::gelu) return false;
  MatmulBwd product = op;
  product.pre_gelu = nullptr;
  be.matmul_bwd(product);
  if (op.dinp) be.activation_bwd(ActivationBwd{op.dinp, op.pre_gelu, size_t(op.N) * op.IC, op.act});
  return true;
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& o);
// Declared always; defined by the CUDA build (a stub that throws otherwise).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& o);
int cuda_device_count();  // 0 when built without CUDA or when no GPU is present

// What a device can do, known before any backend is built: the plan checks a config against it.
struct DeviceCaps {
  std::string name;             // "NVIDIA H200"; empty: unknown
  size_t memory = 0;            // bytes; 0: unknown
  int compute_capability = 0;   // 90 for 9.0 (Hopper); 0 for the CPU or unknown
  bool fp8 = false;             // FP8 products: tensor cores of compute capability 8.9 or later, or emulated
  bool fp8_emulated = false;    // the CPU's emulation of them
};
DeviceCaps cpu_device_caps();
DeviceCaps cuda_device_caps(int device);  // GPU `device` (of cuda_device_count()); all unknown without one

}  // namespace gpt
