// Whether cuDNN's FP8 flash attention can run GPT-2's causal attention on this GPU, and how fast it is
// against the bf16 graphs the trainer runs.
//
//   build/bench/attention_fp8 [--json FILE] [--deterministic] [--shapes B:T:NH:HS,...]
//                                                           (FILE is written whole or not at all)
//
// The trainer's attention is bf16 (kernels/attention.cu): training.precision: fp8 puts the block's four
// products on FP8 operands, not attention. cuDNN's FP8 attention (cudnn-frontend Graph::sdpa_fp8 and
// Graph::sdpa_fp8_backward, per-tensor scaling) has a narrower support surface, and one that depends on
// the architecture: the frontend's checks (1.32) let the Hopper forward take any head size that is a
// multiple of 16 up to 256, but the Hopper backward head size 128 only, and FP8 attention with bf16
// outputs is Blackwell's only. GPT-2 has head size 64 at every model size, so whether FP8 attention is
// available to it depends on the machine; this program builds the graphs and reports what the library
// says rather than assuming it.
//
// Shapes (default): GPT-2 124M at B=64 (64:1024:12:64), 1558M at B=16 (16:1024:25:64), and a head-size-128
// control with 124M's B, T and hidden size C = NH * HS = 768 (64:1024:6:128): the same attention FLOPs as
// the first shape, so the two rows compare head sizes directly and the control shows what the FP8 backward
// gives where it is allowed.
//
// Per shape: the trainer's bf16 forward (with softmax stats) and backward, through gpt::kern::CudnnAttention
// with its heuristic's first plan, as training runs them; then the FP8 forward graph (Q, K, V, O E4M3, in
// the trainer's layouts: Q, K, V strided views of the packed (B,T,3,NH,HS) buffer, O (B,T,NH,HS); causal,
// attention scale 1/sqrt(HS), fp32 stats; every descale and scale a 1x1x1x1 fp32 device scalar set to 1.0,
// every amax a 1x1x1x1 fp32 output) and the FP8 backward graph (the 18-tensor per-tensor overload; dQ, dK,
// dV E4M3 into a packed (B,T,3,NH,HS) buffer; O and stats from the bf16 forward, O rounded to E4M3). For
// each FP8 graph: whether validate, build_operation_graph, create_execution_plans (heuristic modes A and
// fallback; the trainer asks A alone), check_support and build_plans succeeded, and if not, the step and
// cuDNN's message; where it built, one run, then 10 timed back to back (CUDA events; the median).
//
// The inputs are uniform in [-1, 1) rounded to E4M3, the same values in bf16 and FP8, so each FP8 output
// is compared with the bf16 graph's: per tensor (O; dQ, dK, dV), the largest difference over its finite
// elements against its largest bf16 element, and the count of non-finite elements. With unit scales the
// FP8 outputs are coarse (and small gradients underflow E4M3): the comparison tells a wrong layout (a
// difference as large as the values) from rounding, not accuracy. The amaxes the graph wrote say what
// scales a real recipe would take. --deterministic builds both backward graphs without atomics
// (training.deterministic: true; the trainer's default is false, as here).
//
// JSON: {"gpu", "cc", "cudnn_version", "cudnn_frontend_version", "deterministic", "shapes": [{"B", "T",
// "NH", "HS", "fp8_fwd": {"built", "error", "plan", "ms", "max_abs_diff": [O], "bf16_max_abs": [O],
// "nonfinite", "amax": {"S", "O"}}, "fp8_bwd": {..., "max_abs_diff": [dQ, dK, dV], "bf16_max_abs": [...],
// "amax": {"dQ", "dK", "dV", "dP"}}, "bf16_fwd_ms", "bf16_bwd_ms", "bf16_error"}]}. error is "" when the
// graph built and ran ("<step>: <cuDNN's message>" otherwise); what was not measured is null (amax: {}).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/common.hpp"
#include "bench/attention_bench.hpp"
#include "kernels/attention.cuh"
#include "kernels/check.cuh"
#include "kernels/common.cuh"

namespace {

namespace fe = cudnn_frontend;
using gpt::kern::AttentionShape;
using gpt::kern::AttentionTune;
using gpt::kern::CudnnAttention;
using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

constexpr int kReps = 10;

// ---------------------------------------------------------------------------------------------------------
// device memory and data

// One cudaMalloc'd buffer, freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMalloc(&p_, bytes));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class X>
  X* as() const {
    return static_cast<X*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// i -> uniform in [-1, 1), rounded to E4M3; written as FP8 and (exactly) as bf16
struct FillBoth {
  fp8* f8;
  bf16* b16;
  uint32_t seed;
  __device__ void operator()(size_t i) const {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    const fp8 v(float(h & 0xffff) / 32768.0f - 1.0f);
    f8[i] = v;
    b16[i] = __float2bfloat16(float(v));
  }
};

struct ToFp8 {
  const bf16* x;
  fp8* y;
  __device__ void operator()(size_t i) const { y[i] = fp8(__bfloat162float(x[i])); }
};

struct SetFloat {
  float* p;
  float v;
  __device__ void operator()(size_t i) const { p[i] = v; }
};

// Per part p of the buffer (element i is in part (i / C) % parts: the Q, K and V of a packed (B,T,3,NH,HS)
// buffer with parts 3, C = NH * HS): out[3p] = max |got - want| over the elements where got is finite,
// out[3p + 1] = max |want|, both as float bits (non-negative floats order as their bit patterns, so
// atomicMax on the bits is a float max); out[3p + 2] = the count of non-finite got. out zeroed before.
constexpr int kMaxParts = 3;
__global__ void compare_kernel(const fp8* got, const bf16* want, size_t n, size_t C, int parts, unsigned* out) {
  float diff[kMaxParts] = {}, ref[kMaxParts] = {};
  unsigned bad[kMaxParts] = {};
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int p = int(i / C % parts);
    const float g = float(got[i]), w = __bfloat162float(want[i]);
#pragma unroll
    for (int q = 0; q < kMaxParts; ++q) {  // registers, not local memory: no indexing by p
      if (q != p) continue;
      ref[q] = fmaxf(ref[q], fabsf(w));
      if (isfinite(g))
        diff[q] = fmaxf(diff[q], fabsf(g - w));
      else
        ++bad[q];
    }
  }
#pragma unroll
  for (int q = 0; q < kMaxParts; ++q) {
    const float d = gpt::kern::warp_max(diff[q]), r = gpt::kern::warp_max(ref[q]);
    unsigned b = bad[q];
    for (int o = 16; o > 0; o >>= 1) b += __shfl_xor_sync(0xffffffffu, b, o);
    if (threadIdx.x % 32 == 0 && q < parts) {
      atomicMax(&out[3 * q], __float_as_uint(d));
      atomicMax(&out[3 * q + 1], __float_as_uint(r));
      atomicAdd(&out[3 * q + 2], b);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// results

struct GraphResult {
  bool built = false;
  std::string error;  // "<step>: <message>", "" when it built and ran
  std::string plan;   // cuDNN's name of the engine configuration that ran
  double ms = NAN;    // median of kReps runs; NaN: not measured
  // against the bf16 graph's outputs, per output tensor (O; or dQ, dK, dV): empty when not compared
  std::vector<double> max_abs_diff, bf16_max_abs;
  long nonfinite = -1;                               // over all outputs; -1: not compared
  std::vector<std::pair<const char*, double>> amax;  // the graph's amax outputs after its last run
};

struct ShapeResult {
  AttentionShape s;
  GraphResult fwd, bwd;
  double bf16_fwd_ms = NAN, bf16_bwd_ms = NAN;
  std::string bf16_error;
};

// median of kReps runs of run() on stream s, back to back, after one untimed run
double median_ms(const std::function<void()>& run, cudaStream_t s) {
  run();
  cudaEvent_t ev[kReps + 1];
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  std::vector<float> ms(kReps);
  try {
    CUDA_CHECK(cudaEventRecord(ev[0], s));
    for (int r = 0; r < kReps; ++r) {
      run();
      CUDA_CHECK(cudaEventRecord(ev[r + 1], s));
    }
    CUDA_CHECK(cudaEventSynchronize(ev[kReps]));
    for (int r = 0; r < kReps; ++r) CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
  } catch (...) {
    for (auto& e : ev) cudaEventDestroy(e);
    throw;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[kReps / 2 - 1] + ms[kReps / 2]);
}

void compare(GraphResult& r, const fp8* got, const bf16* want, size_t n, size_t C, int parts) {
  DeviceBuffer acc(3 * kMaxParts * sizeof(unsigned));
  CUDA_CHECK(cudaMemset(acc.as<unsigned>(), 0, 3 * kMaxParts * sizeof(unsigned)));
  compare_kernel<<<1024, 256>>>(got, want, n, C, parts, acc.as<unsigned>());
  CUDA_CHECK_LAUNCH();
  unsigned h[3 * kMaxParts];
  CUDA_CHECK(cudaMemcpy(h, acc.as<unsigned>(), sizeof h, cudaMemcpyDeviceToHost));
  r.nonfinite = 0;
  for (int p = 0; p < parts; ++p) {
    float diff, ref;
    std::memcpy(&diff, &h[3 * p], sizeof diff);
    std::memcpy(&ref, &h[3 * p + 1], sizeof ref);
    r.max_abs_diff.push_back(diff);
    r.bf16_max_abs.push_back(ref);
    r.nonfinite += long(h[3 * p + 2]);
  }
}

// ---------------------------------------------------------------------------------------------------------
// the FP8 graphs

// Uids of the graphs' tensors. Scalars (descales, scales, amaxes) each have their own 16-float slot of the
// scalar buffer, at (uid - kFirstScalar) * kSlot floats.
// clang-format off
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };
enum ScalarUid : int64_t {
  kFirstScalar = 100,
  kDescaleQ = kFirstScalar, kDescaleK, kDescaleV, kDescaleO, kDescaleDO, kDescaleS, kDescaleDP,
  kScaleS, kScaleO, kScaleDQ, kScaleDK, kScaleDV, kScaleDP,
  kAmaxS, kAmaxO, kAmaxDQ, kAmaxDK, kAmaxDV, kAmaxDP,
  kEndScalar
};
// clang-format on
constexpr int kSlot = 16;  // floats: 64 bytes between scalars
constexpr int kScalars = int(kEndScalar - kFirstScalar);

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

std::vector<int64_t> packed_stride(const AttentionShape& s) {  // a (B,NH,T,HS) view of (B,T,3,NH,HS)
  const int64_t C3 = 3LL * s.NH * s.HS;
  return {s.T * C3, s.HS, C3, 1};
}
std::vector<int64_t> out_stride(const AttentionShape& s) {  // a (B,NH,T,HS) view of (B,T,NH,HS)
  const int64_t C = int64_t(s.NH) * s.HS;
  return {s.T * C, s.HS, C, 1};
}
std::vector<int64_t> bhsd(const AttentionShape& s) { return {s.B, s.NH, s.T, s.HS}; }
std::vector<int64_t> stats_dim(const AttentionShape& s) { return {s.B, s.NH, s.T, 1}; }
std::vector<int64_t> stats_stride(const AttentionShape& s) { return {int64_t(s.NH) * s.T, s.T, 1, 1}; }

TensorPtr input(fe::graph::Graph& g, const char* name, int64_t uid, std::vector<int64_t> dim,
                std::vector<int64_t> stride, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dim))
                      .set_stride(std::move(stride))
                      .set_data_type(type));
}
TensorPtr scalar(fe::graph::Graph& g, const char* name, int64_t uid) {
  return input(g, name, uid, {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::FLOAT);
}
void output(const TensorPtr& t, int64_t uid, std::vector<int64_t> dim, std::vector<int64_t> stride,
            fe::DataType_t type) {
  t->set_output(true).set_uid(uid).set_dim(std::move(dim)).set_stride(std::move(stride)).set_data_type(type);
}
void scalar_output(const TensorPtr& t, int64_t uid) {
  output(t, uid, {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::FP8_E4M3)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Q, K, V (B,T,3,NH,HS) E4M3 -> O (B,T,NH,HS) E4M3, stats (B,NH,T,1) fp32, amax S and O
std::shared_ptr<fe::graph::Graph> fp8_fwd_graph(const AttentionShape& s) {
  auto g = new_graph();
  const auto E4M3 = fe::DataType_t::FP8_E4M3;
  auto Q = input(*g, "Q", kQ, bhsd(s), packed_stride(s), E4M3);
  auto K = input(*g, "K", kK, bhsd(s), packed_stride(s), E4M3);
  auto V = input(*g, "V", kV, bhsd(s), packed_stride(s), E4M3);
  auto opts = fe::graph::SDPA_fp8_attributes()
                  .set_name("sdpa_fp8_fwd")
                  .set_generate_stats(true)
                  .set_causal_mask(true)
                  .set_attn_scale(1.0f / std::sqrt(float(s.HS)));
  auto [O, Stats, AmaxS, AmaxO] =
      g->sdpa_fp8(Q, K, V, scalar(*g, "descale_q", kDescaleQ), scalar(*g, "descale_k", kDescaleK),
                  scalar(*g, "descale_v", kDescaleV), scalar(*g, "descale_s", kDescaleS),
                  scalar(*g, "scale_s", kScaleS), scalar(*g, "scale_o", kScaleO), opts);
  output(O, kO, bhsd(s), out_stride(s), E4M3);
  output(Stats, kStats, stats_dim(s), stats_stride(s), fe::DataType_t::FLOAT);
  scalar_output(AmaxS, kAmaxS);
  scalar_output(AmaxO, kAmaxO);
  return g;
}

// + O (B,T,NH,HS), dO (B,T,NH,HS) E4M3, stats -> dQ, dK, dV (B,T,3,NH,HS) E4M3, amax dQ, dK, dV, dP
std::shared_ptr<fe::graph::Graph> fp8_bwd_graph(const AttentionShape& s, bool deterministic) {
  auto g = new_graph();
  const auto E4M3 = fe::DataType_t::FP8_E4M3;
  auto Q = input(*g, "Q", kQ, bhsd(s), packed_stride(s), E4M3);
  auto K = input(*g, "K", kK, bhsd(s), packed_stride(s), E4M3);
  auto V = input(*g, "V", kV, bhsd(s), packed_stride(s), E4M3);
  auto O = input(*g, "O", kO, bhsd(s), out_stride(s), E4M3);
  auto dO = input(*g, "dO", kDO, bhsd(s), out_stride(s), E4M3);
  auto St = input(*g, "Stats", kStats, stats_dim(s), stats_stride(s), fe::DataType_t::FLOAT);
  auto opts = fe::graph::SDPA_fp8_backward_attributes()
                  .set_name("sdpa_fp8_bwd")
                  .set_causal_mask(true)
                  .set_attn_scale(1.0f / std::sqrt(float(s.HS)))
                  .set_deterministic_algorithm(deterministic);
  auto [dQ, dK, dV, AmaxDQ, AmaxDK, AmaxDV, AmaxDP] = g->sdpa_fp8_backward(
      Q, K, V, O, dO, St, scalar(*g, "descale_q", kDescaleQ), scalar(*g, "descale_k", kDescaleK),
      scalar(*g, "descale_v", kDescaleV), scalar(*g, "descale_o", kDescaleO), scalar(*g, "descale_do", kDescaleDO),
      scalar(*g, "descale_s", kDescaleS), scalar(*g, "descale_dp", kDescaleDP), scalar(*g, "scale_s", kScaleS),
      scalar(*g, "scale_dq", kScaleDQ), scalar(*g, "scale_dk", kScaleDK), scalar(*g, "scale_dv", kScaleDV),
      scalar(*g, "scale_dp", kScaleDP), opts);
  output(dQ, kDQ, bhsd(s), packed_stride(s), E4M3);
  output(dK, kDK, bhsd(s), packed_stride(s), E4M3);
  output(dV, kDV, bhsd(s), packed_stride(s), E4M3);
  scalar_output(AmaxDQ, kAmaxDQ);
  scalar_output(AmaxDK, kAmaxDK);
  scalar_output(AmaxDV, kAmaxDV);
  scalar_output(AmaxDP, kAmaxDP);
  return g;
}

// The build steps in order; false, with the failing step and cuDNN's message in r.error, at the first
// that fails.
bool build(fe::graph::Graph& g, cudnnHandle_t h, GraphResult& r) {
  const std::pair<const char*, std::function<fe::error_t()>> steps[] = {
      {"validate", [&] { return g.validate(); }},
      {"build_operation_graph", [&] { return g.build_operation_graph(h); }},
      {"create_execution_plans",
       [&] {
         return g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
       }},
      {"check_support", [&] { return g.check_support(h); }},
      {"build_plans", [&] { return g.build_plans(h); }},
  };
  for (const auto& [name, step] : steps) {
    fe::error_t e = step();
    if (e.is_bad()) {
      r.error = std::string(name) + ": " + e.get_message();
      return false;
    }
  }
  r.built = true;
  if (g.get_plan_name(r.plan).is_bad()) r.plan.clear();
  return true;
}

// the scalar slots of uids, added to pack
void add_scalars(std::unordered_map<int64_t, void*>& pack, float* scalars, std::initializer_list<ScalarUid> uids) {
  for (const ScalarUid uid : uids) pack[uid] = scalars + (uid - kFirstScalar) * kSlot;
}

// r.amax: the named amax slots, read back
void read_amax(GraphResult& r, const float* scalars, std::initializer_list<std::pair<const char*, ScalarUid>> slots) {
  for (const auto& [name, uid] : slots) {
    float v = 0.0f;
    CUDA_CHECK(cudaMemcpy(&v, scalars + (uid - kFirstScalar) * kSlot, sizeof v, cudaMemcpyDeviceToHost));
    r.amax.emplace_back(name, v);
  }
}

// Builds the graph make() returns and, where it built, runs it on pack, times it and calls check (if set)
// on its outputs. Anything thrown (the frontend throws when no SDPA implementation takes the attributes)
// becomes r.error, with the step it came from.
void measure(GraphResult& r, const std::function<std::shared_ptr<fe::graph::Graph>()>& make, cudnnHandle_t h,
             std::unordered_map<int64_t, void*>& pack, const std::function<void()>& check) {
  const char* step = "graph construction";
  try {
    auto g = make();
    if (!build(*g, h, r)) return;
    step = "execute";
    int64_t bytes = 0;
    fe::error_t e = g->get_workspace_size(bytes);
    if (e.is_bad()) {
      r.error = std::string("get_workspace_size: ") + e.get_message();
      return;
    }
    DeviceBuffer ws{size_t(bytes)};
    r.ms = median_ms(
        [&] {
          fe::error_t x = g->execute(h, pack, ws.as<void>());
          if (x.is_bad()) throw std::runtime_error(x.get_message());
        },
        nullptr);
    step = "compare";
    if (check) check();
  } catch (const std::exception& x) {
    r.error = std::string(step) + ": " + x.what();
  }
}

// ---------------------------------------------------------------------------------------------------------
// one shape

ShapeResult run_shape(const AttentionShape& s, CudnnAttention& attn, cudnnHandle_t h, float* scalars,
                      bool deterministic) {
  ShapeResult res;
  res.s = s;
  const size_t n = size_t(s.B) * s.T * s.NH * s.HS, C = size_t(s.NH) * s.HS;
  DeviceBuffer qkv(3 * n * sizeof(bf16)), dqkv(3 * n * sizeof(bf16)), out(n * sizeof(bf16)), dout(n * sizeof(bf16)),
      lse(size_t(s.B) * s.NH * s.T * sizeof(float));
  DeviceBuffer qkv8(3 * n), dqkv8(3 * n), out8(n), dout8(n), lse8(size_t(s.B) * s.NH * s.T * sizeof(float)), bwd_o8(n);
  gpt::kern::launch_elementwise(3 * n, FillBoth{qkv8.as<fp8>(), qkv.as<bf16>(), 1u}, nullptr);
  gpt::kern::launch_elementwise(n, FillBoth{dout8.as<fp8>(), dout.as<bf16>(), 2u}, nullptr);
  CUDA_CHECK(cudaMemset(lse.as<void>(), 0, size_t(s.B) * s.NH * s.T * sizeof(float)));
  CUDA_CHECK(cudaMemset(out.as<void>(), 0, n * sizeof(bf16)));

  // the trainer's bf16 graphs
  bool bf16_ran = false;
  try {
    res.bf16_fwd_ms =
        median_ms([&] { attn.fwd(out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), s, nullptr); }, nullptr);
    res.bf16_bwd_ms = median_ms(
        [&] {
          attn.bwd(dqkv.as<bf16>(), dout.as<bf16>(), qkv.as<bf16>(), out.as<bf16>(), lse.as<float>(), s, nullptr);
        },
        nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    bf16_ran = true;
  } catch (const std::exception& x) {
    res.bf16_error = x.what();
  }

  // FP8 forward
  std::unordered_map<int64_t, void*> fwd_pack = {{kQ, qkv8.as<fp8>()},
                                                 {kK, qkv8.as<fp8>() + C},
                                                 {kV, qkv8.as<fp8>() + 2 * C},
                                                 {kO, out8.as<fp8>()},
                                                 {kStats, lse8.as<float>()}};
  add_scalars(fwd_pack, scalars, {kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO});
  measure(
      res.fwd, [&] { return fp8_fwd_graph(s); }, h, fwd_pack,
      [&] {
        read_amax(res.fwd, scalars, {{"S", kAmaxS}, {"O", kAmaxO}});
        if (bf16_ran) compare(res.fwd, out8.as<fp8>(), out.as<bf16>(), n, C, 1);
      });

  // FP8 backward, on the bf16 forward's O (rounded to E4M3) and stats: its inputs are the bf16 backward's
  // (without a bf16 forward, O and the stats are zero: a timing only)
  gpt::kern::launch_elementwise(n, ToFp8{out.as<bf16>(), bwd_o8.as<fp8>()}, nullptr);
  std::unordered_map<int64_t, void*> bwd_pack = {
      {kQ, qkv8.as<fp8>()},   {kK, qkv8.as<fp8>() + C},   {kV, qkv8.as<fp8>() + 2 * C},
      {kO, bwd_o8.as<fp8>()}, {kDO, dout8.as<fp8>()},     {kStats, lse.as<float>()},
      {kDQ, dqkv8.as<fp8>()}, {kDK, dqkv8.as<fp8>() + C}, {kDV, dqkv8.as<fp8>() + 2 * C}};
  add_scalars(bwd_pack, scalars,
              {kDescaleQ, kDescaleK, kDescaleV, kDescaleO, kDescaleDO, kDescaleS, kDescaleDP, kScaleS, kScaleDQ,
               kScaleDK, kScaleDV, kScaleDP, kAmaxDQ, kAmaxDK, kAmaxDV, kAmaxDP});
  measure(
      res.bwd, [&] { return fp8_bwd_graph(s, deterministic); }, h, bwd_pack,
      [&] {
        read_amax(res.bwd, scalars, {{"dQ", kAmaxDQ}, {"dK", kAmaxDK}, {"dV", kAmaxDV}, {"dP", kAmaxDP}});
        if (bf16_ran) compare(res.bwd, dqkv8.as<fp8>(), dqkv.as<bf16>(), 3 * n, C, 3);
      });
  CUDA_CHECK(cudaDeviceSynchronize());
  return res;
}

// ---------------------------------------------------------------------------------------------------------
// input and output

// r as JSON: what was not measured null (NaN as well: dump writes it so), amax {} when none was read
nlohmann::ordered_json json_graph(const GraphResult& r) {
  using nlohmann::ordered_json;
  ordered_json amax = ordered_json::object();
  for (const auto& [name, v] : r.amax) amax[name] = v;
  const auto numbers = [](const std::vector<double>& v) { return v.empty() ? ordered_json() : ordered_json(v); };
  return {{"built", r.built},
          {"error", r.error},
          {"plan", r.plan},
          {"ms", r.ms},
          {"max_abs_diff", numbers(r.max_abs_diff)},
          {"bf16_max_abs", numbers(r.bf16_max_abs)},
          {"nonfinite", r.nonfinite < 0 ? ordered_json() : ordered_json(r.nonfinite)},
          {"amax", amax}};
}

std::string shape_label(const AttentionShape& s) {
  return std::to_string(s.B) + ":" + std::to_string(s.T) + ":" + std::to_string(s.NH) + ":" + std::to_string(s.HS);
}
std::string cell(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}
std::string ratio(double fp8_ms, double bf16_ms) {
  if (!std::isfinite(fp8_ms) || !std::isfinite(bf16_ms) || fp8_ms <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", bf16_ms / fp8_ms);
  return buf;
}

void print_table(const std::vector<ShapeResult>& rs) {
  std::printf("%-16s %10s %10s %8s   %10s %10s %8s\n", "B:T:NH:HS", "fp8 fwd", "bf16 fwd", "speedup", "fp8 bwd",
              "bf16 bwd", "speedup");
  for (const ShapeResult& r : rs)
    std::printf("%-16s %10s %10s %8s   %10s %10s %8s\n", shape_label(r.s).c_str(), cell(r.fwd.ms).c_str(),
                cell(r.bf16_fwd_ms).c_str(), ratio(r.fwd.ms, r.bf16_fwd_ms).c_str(), cell(r.bwd.ms).c_str(),
                cell(r.bf16_bwd_ms).c_str(), ratio(r.bwd.ms, r.bf16_bwd_ms).c_str());
  std::printf("(ms, median of %d runs; speedup = bf16 ms / fp8 ms; -: not run)\n\n", kReps);
  for (const ShapeResult& r : rs) {
    const std::string label = shape_label(r.s);
    if (!r.bf16_error.empty()) std::printf("%s bf16: %s\n", label.c_str(), r.bf16_error.c_str());
    const std::pair<const char*, const GraphResult*> graphs[] = {{"fp8 fwd", &r.fwd}, {"fp8 bwd", &r.bwd}};
    for (const auto& [dir, g] : graphs) {
      const char* what = !g->built ? "not built" : std::isnan(g->ms) ? "built, did not run" : "ran";
      std::printf("%s %s: %s", label.c_str(), dir, what);
      if (!g->plan.empty()) std::printf(", plan %s", g->plan.c_str());
      if (!g->error.empty()) std::printf(": %s", g->error.c_str());
      std::printf("\n");
      if (!g->max_abs_diff.empty()) {
        static const char* const kNames[2][kMaxParts] = {{"O"}, {"dQ", "dK", "dV"}};
        std::printf("    max |fp8 - bf16| (max |bf16|):");
        for (size_t p = 0; p < g->max_abs_diff.size(); ++p)
          std::printf(" %s %s (%s)", kNames[g == &r.bwd][p], cell(g->max_abs_diff[p]).c_str(),
                      cell(g->bf16_max_abs[p]).c_str());
        std::printf("; %ld non-finite\n", g->nonfinite);
      }
      if (!g->amax.empty()) {
        std::printf("    amax:");
        for (const auto& [name, v] : g->amax) std::printf(" %s %.4g", name, v);
        std::printf("\n");
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  gpt::bench::AttentionOptions o;
  o.shapes = "64:1024:12:64,16:1024:25:64,64:1024:6:128";
  try {
    if (!gpt::bench::parse_args(argc, argv, o)) return 1;
    const std::vector<AttentionShape> shapes = gpt::bench::parse_shapes(o.shapes);
    if (gpt::bench::skip_without_device()) return 0;
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const size_t v = cudnnGetVersion();
    const std::string cudnn_version =
        std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
    const std::string cc = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    std::printf("%s (cc %s), cuDNN %s, cudnn-frontend %d.%d.%d%s\n\n", prop.name, cc.c_str(), cudnn_version.c_str(),
                CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION,
                o.deterministic ? ", deterministic backward" : "");

    CudnnAttention attn(
        [](size_t n) {
          void* p = nullptr;
          CUDA_CHECK(cudaMalloc(&p, n));
          return p;
        },
        [](void* p) { cudaFree(p); }, o.deterministic, AttentionTune::kHeuristic);
    cudnnHandle_t handle = nullptr;
    CUDNN_CHECK(cudnnCreate(&handle));
    std::unique_ptr<cudnnContext, cudnnStatus_t (*)(cudnnHandle_t)> handle_owner(handle, cudnnDestroy);
    DeviceBuffer scalars(size_t(kScalars) * kSlot * sizeof(float));
    // descales and scales 1.0; the amax slots are overwritten by each run
    gpt::kern::launch_elementwise(size_t(kScalars) * kSlot, SetFloat{scalars.as<float>(), 1.0f}, nullptr);

    std::vector<ShapeResult> results;
    for (const AttentionShape& s : shapes) {
      try {
        results.push_back(run_shape(s, attn, handle, scalars.as<float>(), o.deterministic));
      } catch (const std::exception& x) {  // the shape's buffers (out of memory), or a CUDA error left behind
        ShapeResult r;
        r.s = s;
        r.bf16_error = r.fwd.error = r.bwd.error = std::string("shape setup: ") + x.what();
        results.push_back(r);
      }
    }
    print_table(results);

    nlohmann::ordered_json shapes_js = nlohmann::ordered_json::array();
    for (const ShapeResult& r : results)
      shapes_js.push_back({{"B", r.s.B},
                           {"T", r.s.T},
                           {"NH", r.s.NH},
                           {"HS", r.s.HS},
                           {"fp8_fwd", json_graph(r.fwd)},
                           {"fp8_bwd", json_graph(r.bwd)},
                           {"bf16_fwd_ms", r.bf16_fwd_ms},
                           {"bf16_bwd_ms", r.bf16_bwd_ms},
                           {"bf16_error", r.bf16_error}});
    gpt::bench::write_json(o.json_path,
                           {{"gpu", std::string(prop.name)},
                            {"cc", cc},
                            {"cudnn_version", cudnn_version},
                            {"cudnn_frontend_version", std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
                                                           std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                                                           std::to_string(CUDNN_FRONTEND_PATCH_VERSION)},
                            {"deterministic", o.deterministic},
                            {"shapes", shapes_js}});
  } catch (const gpt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return gpt::kExitFailure;
  }
  return 0;
}
