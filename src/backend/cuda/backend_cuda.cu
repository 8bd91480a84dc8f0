// The CUDA backend: activations in bf16 (precision bf16) or fp32 (precision fp32, TF32 matmuls).
// One compute stream; every op is queued on it and none synchronises with the host except copy_d2h,
// copy_h2d (its host buffer may be reused on return) and sum_squares. A second stream carries the
// background device-to-host copies of checkpoint snapshots (copy_d2h_async), ordered by events.
//
// Memory: plain cudaMalloc. bytes_in_use()/peak_bytes() are this backend's own tally of what it has
// allocated: model buffers and its internal ones (cuBLASLt workspace, kernel scratch, cuDNN workspace).
// The CUDA context and the libraries' own handle state are not included.
//
// Attention in fp32 precision: cuDNN's flash attention has no fp32 path, so q, k, v (and dout) are
// rounded to bf16 in scratch memory, attention runs in bf16 with fp32 softmax statistics, and the
// results are widened back to fp32. That op alone therefore has bf16 input rounding in fp32 mode.
//
// Errors: every op goes through dispatch() and every other call into CUDA through kernel_boundary(), so
// what reaches the caller is a gpt::Error with the exit status it should end with, never a kernel error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/fp8_cuda.cuh"
#include "backend/cuda/kernel_boundary.cuh"
#include "backend/cuda/op_profiler.cuh"
#include "base/activation.hpp"
#include "base/random.hpp"
#include "kernels/activation.cuh"
#include "kernels/attention.cuh"
#include "kernels/check.cuh"
#include "kernels/classifier.cuh"
#include "kernels/conversions.cuh"
#include "kernels/encoder.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/normal_init.cuh"
#include "kernels/rope.cuh"
#include "kernels/sum_squares.cuh"

namespace gpt {

namespace {

using kern::bf16;


cudaDataType_t lib_dtype(DType t) { return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }

class CudaBackend final : public Backend, public Fp8ProductsOwner {
 public:
  explicit CudaBackend(const BackendOptions& o) : prof_(o.op_profile) {
    int local_rank = o.local_rank;
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    // One GPU per local rank: rank i takes GPU i, or the only GPU it sees when the launcher binds one
    // GPU to each task (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank).
    if (count == 1) local_rank = 0;
    if (local_rank < 0 || local_rank >= count)
      throw Error(kExitBadInput, "local rank " + std::to_string(local_rank) + " has no GPU: " +
                                     std::to_string(count) + " visible (one GPU per local rank)");
    device_ = local_rank;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    dtype_ = o.act;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&copy_ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    lt_ws_ = alloc(kCublasWorkspaceBytes);
    // deterministic: cuBLASLt's first-choice algorithm for each shape and cuDNN's deterministic
    // attention backward, so a run and its resumption compute bit-identical steps. Otherwise the
    // fastest: matmul algorithms timed on first use, attention backward with atomics.
    const bool det = o.deterministic;
    lt_ = std::make_unique<kern::CublasLt>(lib_dtype(dtype_), lt_ws_, kCublasWorkspaceBytes, /*autotune=*/!det,
                                           o.matmul_search_s);
    attn_ = std::make_unique<kern::CudnnAttention>([this](size_t n) { return alloc(n); },
                                                   [this](void* q) { free(q); }, det);
    sumsq_ = static_cast<double*>(alloc(sizeof(double)));
    const bool fp8_cores = prop_.major > 8 || (prop_.major == 8 && prop_.minor >= 9);  // Ada, Hopper and later
    if (dtype_ == DType::BF16 && fp8_cores)  // FP8 products take bf16 activations
      fp8_ = make_cuda_fp8_products(
          {stream_, lt_.get(), &prof_, [this](size_t n) { return scratch_for(n); }, o.fp8_fast_accum});
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(copy_stream_);  // no copy reads memory freed below
    cudaStreamSynchronize(stream_);
    fp8_.reset();
    attn_.reset();
    lt_.reset();
    for (auto& [p, n] : sizes_) cudaFree(p);
    cudaStreamDestroy(stream_);
    cudaEventDestroy(copy_ready_);
    cudaEventDestroy(copied_);
    for (cudaEvent_t e : download_done_)
      if (e) cudaEventDestroy(e);
    cudaStreamDestroy(copy_stream_);
  }

  std::string name() const override { return "cuda"; }
  std::string hardware() const override { return prop_.name; }
  DType act_dtype() const override { return dtype_; }
  double peak_flops() const override {
    // dense tensor-core peaks: bf16, or TF32 in fp32 precision (H100/H200 SXM; A100)
    const bool f32 = dtype_ == DType::F32;
    if (prop_.major == 9) return f32 ? 494.7e12 : 989.5e12;
    if (prop_.major == 8 && prop_.minor == 0) return f32 ? 156e12 : 312e12;
    return 0;
  }

  // ---- memory
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error(kExitOutOfMemory, "out of GPU memory on device " + std::to_string(device_) + ": needed " +
                                        std::to_string(bytes) + " bytes, " + std::to_string(free_b) +
                                        " free of " + std::to_string(total_b) + " (" +
                                        std::to_string(in_use_) + " allocated by this backend)");
    }
    kernel_boundary([&] { CUDA_CHECK(e); });
    std::lock_guard<std::mutex> g(mu_);
    sizes_[p] = bytes;
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = sizes_.find(p);
      if (it == sizes_.end()) throw Error(kExitFailure, "CudaBackend::free of a pointer it did not allocate");
      in_use_ -= it->second;
      sizes_.erase(it);
    }
    kernel_boundary([&] { CUDA_CHECK(cudaFree(p)); });
  }
  void zero(void* p, size_t bytes) override {
    OpProfiler::Scope t(prof_, stream_, "zero");
    kernel_boundary([&] { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_)); });
  }
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    kernel_boundary([&] {
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    });
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    kernel_boundary([&] {
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    });
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    OpProfiler::Scope t(prof_, stream_, "copy_d2d");
    kernel_boundary([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_)); });
  }
  void synchronize() override {
    kernel_boundary([&] { CUDA_CHECK(cudaStreamSynchronize(stream_)); });
    prof_.harvest();
  }
  std::string op_profile() const override { return prof_.table(); }
  void op_profile_reset() override { prof_.reset(); }
  void op_profile_pause(bool paused) override { prof_.pause(paused); }
  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes() const override { return peak_; }
  void reset_peak() override { peak_ = in_use_; }
  void* stream() override { return stream_; }

  // ---- background copies: the copy stream waits for the compute stream at each copy; `copied_` marks
  // the newest copy's end, which after_copies makes the compute stream wait for
  bool pin_host(void* p, size_t bytes) override {
    // from any thread (the checkpoints' memory is page-locked on one of its own): this GPU, not GPU 0
    if (cudaSetDevice(device_) == cudaSuccess && cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess)
      return true;
    cudaGetLastError();  // not sticky: the memory stays pageable and copies into it still work
    return false;
  }
  void unpin_host(void* p) override { kernel_boundary([&] { CUDA_CHECK(cudaHostUnregister(p)); }); }
  void copy_d2h_async(void* dst, const void* src, size_t bytes) override {
    kernel_boundary([&] {
      CUDA_CHECK(cudaEventRecord(copy_ready_, stream_));
      CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, copy_ready_, 0));
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
      CUDA_CHECK(cudaEventRecord(copied_, copy_stream_));
    });
    copies_pending_ = true;
  }
  void after_copies() override {
    if (!copies_pending_) return;
    kernel_boundary([&] { CUDA_CHECK(cudaStreamWaitEvent(stream_, copied_, 0)); });
    copies_pending_ = false;
  }
  void wait_copies() override {
    kernel_boundary([&] {
      CUDA_CHECK(cudaSetDevice(device_));  // from another thread (the checkpoint writer's): this GPU, not GPU 0
      CUDA_CHECK(cudaEventSynchronize(copied_));
    });
  }
  // the offloaded optimizer's transfers: downloads on the copy stream, each marked by an event of a ring
  uint64_t download(void* dst, const void* src, size_t bytes) override {
    const uint64_t t = downloads_++;
    kernel_boundary([&] {
      cudaEvent_t& done = download_done_[t % kDownloadEvents];
      if (!done) CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventRecord(copy_ready_, stream_));
      CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, copy_ready_, 0));
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
      CUDA_CHECK(cudaEventRecord(done, copy_stream_));
    });
    return t;
  }
  void wait_download(uint64_t ticket) override {
    if (ticket + kDownloadEvents < downloads_)
      throw Error(kExitFailure, "internal error: waiting for a download older than the event ring");
    kernel_boundary([&] { CUDA_CHECK(cudaEventSynchronize(download_done_[ticket % kDownloadEvents])); });
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    OpProfiler::Scope t(prof_, stream_, "offload_upload");
    kernel_boundary([&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_)); });
  }

  // ---- conversions and elementwise
  using Backend::add_inplace;
  void convert(const Convert& op) override {
    OpProfiler::Scope t(prof_, stream_, op.to_act ? "f32_to_act" : "act_to_f32");
    dispatch([&](auto x) {
      if constexpr (std::is_same_v<decltype(x), float>)
        copy_d2d(op.dst, op.src, op.n * sizeof(float));
      else if (op.to_act)
        kern::f32_to_bf16(static_cast<bf16*>(op.dst), static_cast<const float*>(op.src), op.n, stream_);
      else
        kern::bf16_to_f32(static_cast<float*>(op.dst), static_cast<const bf16*>(op.src), op.n, stream_);
    });
  }
  void add_inplace(const AddInplace& op) override {
    OpProfiler::Scope t(prof_, stream_, "add_inplace");
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::add_inplace<X>(static_cast<X*>(op.dst), static_cast<const X*>(op.src), op.n, stream_);
    });
  }

  // ---- model ops
  void encoder_fwd(const EncoderFwd& op) override {
    void* out = op.out;
    const int* tokens = op.tokens;
    const void *wte = op.wte, *wpe = op.wpe;
    const int B = op.B, T = op.T, C = op.C;
    OpProfiler::Scope t(prof_, stream_, "encoder_fwd");
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::EncoderFwdArgs<X> a;
      a.out = static_cast<X*>(out), a.tokens = tokens;
      a.wte = static_cast<const X*>(wte), a.wpe = static_cast<const X*>(wpe), a.B = B, a.T = T, a.C = C;
      kern::encoder_fwd<X>(a, stream_);
    });
  }
  void encoder_bwd(const EncoderBwd& op) override {
    void *dwte = op.dwte, *dwpe = op.dwpe;
    const void* dout = op.dout;
    const int* tokens = op.tokens;
    const int B = op.B, T = op.T, C = op.C;
    OpProfiler::Scope t(prof_, stream_, "encoder_bwd");
    void* scratch = scratch_for(kern::encoder_bwd_scratch_bytes(B * T));
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::EncoderBwdArgs<X> a;
      a.dwte = static_cast<X*>(dwte), a.dwpe = static_cast<X*>(dwpe), a.dout = static_cast<const X*>(dout);
      a.tokens = tokens, a.B = B, a.T = T, a.C = C, a.scratch = scratch;
      kern::encoder_bwd<X>(a, stream_);
    });
  }
  void norm_fwd(const NormFwd& op) override {
    const bool rms = op.kind == NormKind::rmsnorm, q = op.q.data != nullptr;
    static const char* const names[2][2][2] = {  // [rms][residual][fp8]
        {{"layernorm_fwd", "layernorm_fwd_fp8"}, {"residual_layernorm_fwd", "residual_layernorm_fwd_fp8"}},
        {{"rmsnorm_fwd", "rmsnorm_fwd_fp8"}, {"residual_rmsnorm_fwd", "residual_rmsnorm_fwd_fp8"}}};
    OpProfiler::Scope t(prof_, stream_, names[rms][op.b != nullptr][q]);
    if (q && dtype_ != DType::BF16) throw Error(kExitFailure, "internal error: an FP8 norm output in fp32 precision");
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::LayerNormFwdArgs<X> a;
      a.out = static_cast<X*>(op.out), a.mean = op.mean, a.rstd = op.rstd;
      if (op.b) {
        a.residual = static_cast<X*>(op.residual);
        a.a = static_cast<const X*>(op.a), a.b = static_cast<const X*>(op.b);
      } else {
        a.inp = static_cast<const X*>(op.a);
      }
      a.w = static_cast<const X*>(op.w), a.bias = static_cast<const X*>(op.bias), a.N = op.N, a.C = op.C;
      a.rms = rms;
      if (q) {
        a.out = nullptr;
        a.out_fp8 = static_cast<uint8_t*>(op.q.data), a.fp8_scale = op.q.scale, a.fp8_amax = op.q.amax;
        a.fp8_fmt = op.q.fmt;
      }
      kern::layernorm_fwd<X>(a, stream_);
    });
  }
  void norm_bwd(const NormBwd& op) override {
    OpProfiler::Scope t(prof_, stream_, op.kind == NormKind::rmsnorm ? "rmsnorm_bwd" : "layernorm_bwd");
    float* scratch = static_cast<float*>(scratch_for(kern::layernorm_bwd_scratch_bytes(op.N, op.C, num_sms())));
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::LayerNormBwdArgs<X> a;
      a.dinp = static_cast<X*>(op.dinp), a.dw = static_cast<X*>(op.dw), a.db = static_cast<X*>(op.db);
      a.dout = static_cast<const X*>(op.dout), a.inp = static_cast<const X*>(op.inp), a.w = static_cast<const X*>(op.w);
      a.mean = op.mean, a.rstd = op.rstd, a.N = op.N, a.C = op.C, a.dinp_colsum = op.dinp_colsum;
      a.rms = op.kind == NormKind::rmsnorm;
      a.scratch = scratch, a.num_sms = num_sms();
      kern::layernorm_bwd<X>(a, stream_);
    });
  }
  using Backend::matmul_fwd;
  using Backend::matmul_bwd;
  void matmul_fwd(const MatmulFwd& op) override {
    if (matmul_fwd_unfused(*this, op)) return;
    if (!fp8_matmul_fwd(fp8_.get(), op)) values_fwd(op.out, op.inp.x, op.w.x, op.bias, op.N, op.IC, op.OC, op.pre_gelu);
  }
  void matmul_bwd(const MatmulBwd& op) override {
    if (matmul_bwd_unfused(*this, op)) return;
    if (!fp8_matmul_bwd(fp8_.get(), op))
      values_bwd(op.dinp, op.dw, op.dbias, op.dout.x, op.inp.x, op.w.x, op.N, op.IC, op.OC, op.pre_gelu, op.dout_colsum);
  }
  void values_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int IC, int OC, void* pre_gelu) {
    OpProfiler::Scope t(prof_, stream_,
                        prof_.enabled() ? matmul_op_name("matmul_fwd", IC, OC, pre_gelu ? " +gelu" : "") : "");
    kern::MatmulFwdArgs a;
    a.out = out, a.inp = inp, a.w = w, a.bias = bias, a.N = N, a.IC = IC, a.OC = OC, a.pre_gelu = pre_gelu;
    dispatch([&](auto x) { kern::matmul_fwd<decltype(x)>(*lt_, a, stream_); });
  }
  void values_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, int N, int IC,
                  int OC, const void* pre_gelu, const float* dout_colsum) {
    OpProfiler::Scope t(prof_, stream_,
                        prof_.enabled() ? matmul_op_name("matmul_bwd", IC, OC, pre_gelu ? " +dgelu" : "") : "");
    kern::MatmulBwdArgs a;
    a.dinp = dinp, a.dw = dw, a.dbias = dbias, a.dout = dout, a.inp = inp, a.w = w;
    a.N = N, a.IC = IC, a.OC = OC, a.pre_gelu = pre_gelu, a.dout_colsum = dout_colsum, a.num_sms = num_sms();
    if (dbias && !dout_colsum)  // the bias gradient's own column sums need scratch
      a.scratch = static_cast<float*>(scratch_for(kern::bias_grad_scratch_bytes(N, OC, num_sms())));
    dispatch([&](auto x) { kern::matmul_bwd<decltype(x)>(*lt_, a, stream_); });
  }
  void rope(const Rope& op) override {
    OpProfiler::Scope t(prof_, stream_, op.inverse ? "rope_bwd" : "rope_fwd");
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::RopeArgs<X> a;
      a.qkv = static_cast<X*>(op.qkv), a.B = op.B, a.T = op.T, a.NH = op.NH, a.HS = op.HS, a.inverse = op.inverse;
      kern::rope<X>(a, stream_);
    });
  }
  void attention_fwd(const AttentionFwd& op) override {
    void* out = op.out;
    float* lse = op.lse;
    const void* qkv = op.qkv;
    const int B = op.B, T = op.T, NH = op.NH, HS = op.HS;
    OpProfiler::Scope t(prof_, stream_, "attention_fwd");
    const kern::AttentionShape sh{B, T, NH, HS};
    dispatch([&](auto x) {
      if constexpr (std::is_same_v<decltype(x), bf16>) {
        attn_->fwd(static_cast<bf16*>(out), lse, static_cast<const bf16*>(qkv), sh, stream_);
      } else {  // fp32: through bf16 copies in scratch
        const size_t n_out = size_t(B) * T * NH * HS, n_qkv = 3 * n_out;
        bf16* buf = static_cast<bf16*>(scratch_for((n_qkv + n_out) * sizeof(bf16)));
        bf16 *q = buf, *o = buf + n_qkv;
        kern::f32_to_bf16(q, static_cast<const float*>(qkv), n_qkv, stream_);
        attn_->fwd(o, lse, q, sh, stream_);
        kern::bf16_to_f32(static_cast<float*>(out), o, n_out, stream_);
      }
    });
  }
  void attention_bwd(const AttentionBwd& op) override {
    void* dqkv = op.dqkv;
    const void *dout = op.dout, *qkv = op.qkv, *out = op.out;
    const float* lse = op.lse;
    const int B = op.B, T = op.T, NH = op.NH, HS = op.HS;
    OpProfiler::Scope t(prof_, stream_, "attention_bwd");
    const kern::AttentionShape sh{B, T, NH, HS};
    dispatch([&](auto x) {
      if constexpr (std::is_same_v<decltype(x), bf16>) {
        attn_->bwd(static_cast<bf16*>(dqkv), static_cast<const bf16*>(dout), static_cast<const bf16*>(qkv),
                   static_cast<const bf16*>(out), lse, sh, stream_);
      } else {  // fp32: through bf16 copies in scratch
        const size_t n_out = size_t(B) * T * NH * HS, n_qkv = 3 * n_out;
        bf16* buf = static_cast<bf16*>(scratch_for((2 * n_qkv + 2 * n_out) * sizeof(bf16)));
        bf16 *q = buf, *dq = buf + n_qkv, *o = buf + 2 * n_qkv, *dout_b = o + n_out;
        kern::f32_to_bf16(q, static_cast<const float*>(qkv), n_qkv, stream_);
        kern::f32_to_bf16(o, static_cast<const float*>(out), n_out, stream_);
        kern::f32_to_bf16(dout_b, static_cast<const float*>(dout), n_out, stream_);
        attn_->bwd(dq, dout_b, q, o, lse, sh, stream_);
        kern::bf16_to_f32(static_cast<float*>(dqkv), dq, n_qkv, stream_);
      }
    });
  }
  void activation_fwd(const ActivationFwd& op) override {
    OpProfiler::Scope t(prof_, stream_, activation_op_names(op.act).fwd);
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::activation_fwd<X>(op.act, static_cast<X*>(op.out), static_cast<const X*>(op.inp), op.n, stream_);
    });
  }
  void activation_bwd(const ActivationBwd& op) override {
    OpProfiler::Scope t(prof_, stream_, activation_op_names(op.act).bwd);
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::activation_bwd_inplace<X>(op.act, static_cast<X*>(op.d), static_cast<const X*>(op.pre), op.n, stream_);
    });
  }
  using Backend::classifier;
  void classifier(const ClassifierLoss& op) override {
    if (!fp8_classifier(fp8_.get(), op)) values_loss(op.logits, op.losses, op.targets, op.N, op.V, op.Vp, op.dloss);
  }
  void values_loss(void* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss) {
    OpProfiler::Scope t(prof_, stream_, "classifier");
    dispatch([&](auto x) {
      using X = decltype(x);
      kern::ClassifierArgs<X> a;
      a.logits = static_cast<X*>(logits), a.losses = losses, a.targets = targets;
      a.N = N, a.V = V, a.Vp = Vp, a.dloss = dloss;
      kern::classifier<X>(a, stream_);
    });
  }
  // The device draws every value; the few within kNormalInitGuard of a float rounding boundary (about one
  // in 2^16), where CUDA's log and cos might round otherwise than the host's, are drawn again on the host
  // and put in place: the host's bits, at the device's speed.
  void normal_init(const NormalInit& op) override {
    if (op.n == 0) return;
    size_t cap = std::max<size_t>(4096, op.n >> 12);  // 256 times the expected count
    for (;;) {
      // the count, then cap positions and cap values
      char* buf = static_cast<char*>(alloc(8 + 12 * cap));
      auto* count = reinterpret_cast<unsigned long long*>(buf);
      auto* at = reinterpret_cast<uint64_t*>(buf + 8);
      auto* val = reinterpret_cast<float*>(buf + 8 + 8 * cap);
      unsigned long long k = 0;
      try {
        {
          OpProfiler::Scope t(prof_, stream_, "normal_init");
          kernel_boundary([&] { kern::normal_init(op.dst, op.n, op.seed, op.index, op.std, at, cap, count, stream_); });
        }
        copy_d2h(&k, count, sizeof k);
        if (k <= cap && k > 0) {
          std::vector<uint64_t> where(k);
          std::vector<float> host(k);
          copy_d2h(where.data(), at, 8 * k);
          for (size_t j = 0; j < k; ++j) host[j] = float(normal_init_value(op.seed, op.index + where[j], op.std));
          copy_h2d(val, host.data(), 4 * k);
          kernel_boundary([&] {
            kern::scatter(op.dst, at, val, k, stream_);
            CUDA_CHECK(cudaStreamSynchronize(stream_));  // before val is freed
          });
        }
      } catch (...) {
        free(buf);
        throw;
      }
      free(buf);
      if (k <= cap) return;
      cap = size_t(k);  // more than 256 times the expected count: again, with room for them all
    }
  }
  double sum_squares(const SumSquares& op) override {
    double* out = op.out ? op.out : sumsq_;  // returned: through the backend's own double
    void* scratch = scratch_for(kern::sum_squares_scratch_bytes());
    {
      OpProfiler::Scope t(prof_, stream_, "sum_squares");
      dispatch([&](auto tag) {
        using X = decltype(tag);
        kern::sum_squares<X>(out, static_cast<const X*>(op.x), op.n, scratch, stream_);
      });
    }
    if (op.out) return 0;
    double h = 0;
    copy_d2h(&h, sumsq_, sizeof(double));
    return h;
  }
  std::string supports_fp8() const override {
    if (fp8_) return "";
    if (dtype_ != DType::BF16) return "FP8 products take bf16 activations, not " + std::string(dtype_name(dtype_));
    return hardware() + " has no FP8 tensor cores (compute capability 8.9 or later: Ada, Hopper)";
  }
  Fp8Products* fp8_products() override { return fp8_.get(); }
  void fp8_cast(const Fp8Cast& op) override { gpt::fp8_cast(fp8_.get(), op); }
  void fp8_quantize(const Fp8Quantize& op) override { fp8_products_of(fp8_.get()).quantize(op); }
  void fp8_transpose(const Fp8Transpose& op) override { fp8_products_of(fp8_.get()).transpose(op); }
  void fp8_update_scales(const Fp8UpdateScales& op) override { fp8_products_of(fp8_.get()).update_scales(op); }
  void run_op(const char* name, const std::function<void(void*)>& fn) override {
    OpProfiler::Scope t(prof_, stream_, name);
    kernel_boundary([&] { fn(stream_); });
  }

 private:
  // Every op's way in: fn(X{}) with X the activation type (bf16 or float), the kernels' errors turned
  // into the program's (kernel_boundary.cuh).
  template <class Fn>
  void dispatch(Fn&& fn) {
    kernel_boundary([&] {
      if (dtype_ == DType::BF16)
        fn(bf16{});
      else
        fn(float{});
    });
  }
  int num_sms() const { return prop_.multiProcessorCount; }
  // One scratch buffer shared by the ops (one stream: no two ops use it at once). It only grows, in
  // kCudaScratchStep steps, so after the first step of a run nothing is allocated.
  void* scratch_for(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) free(scratch_);
      scratch_bytes_ = (bytes + kCudaScratchStep - 1) / kCudaScratchStep * kCudaScratchStep;
      scratch_ = alloc(scratch_bytes_);
    }
    return scratch_;
  }

  int device_ = 0;
  cudaDeviceProp prop_{};
  DType dtype_ = DType::BF16;
  cudaStream_t stream_ = nullptr;
  void* lt_ws_ = nullptr;
  std::unique_ptr<kern::CublasLt> lt_;
  std::unique_ptr<kern::CudnnAttention> attn_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  double* sumsq_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // copy_d2h_async
  cudaEvent_t copy_ready_ = nullptr, copied_ = nullptr;
  bool copies_pending_ = false;  // a copy queued that the compute stream has not waited for yet
  static constexpr uint64_t kDownloadEvents = 64;
  cudaEvent_t download_done_[kDownloadEvents] = {};  // download t's end: download_done_[t % 64]
  uint64_t downloads_ = 0;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  size_t in_use_ = 0, peak_ = 0;
  OpProfiler prof_;
  std::unique_ptr<Fp8Products> fp8_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& o) {
  return kernel_boundary([&] { return std::make_unique<CudaBackend>(o); });
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

DeviceCaps cuda_device_caps(int device) {
  DeviceCaps c;
  if (device < 0 || device >= cuda_device_count()) return c;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return c;
  }
  c.name = prop.name;
  c.memory = prop.totalGlobalMem;
  c.compute_capability = 10 * prop.major + prop.minor;
  c.fp8 = c.compute_capability >= 89;  // Ada (8.9) and Hopper (9.0) on: FP8 tensor cores
  return c;
}

}  // namespace gpt
