// training.memory_fit: auto (run/memory_fit.hpp): the chooser on a tiny CPU model against budgets that
// leave it everything, force the smallest state and full-block recompute, or fit nothing; the keys a config
// gives kept; the step-time model against the measurements it is calibrated with.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "config/config_io.hpp"
#include "optim/optimizer.hpp"
#include "run/memory_fit.hpp"
#include "test_util.hpp"

using namespace gpt;

namespace {

// A tiny CPU model, 256 tokens a step (16 sequences of 16), the split left to the chooser.
constexpr const char* kTiny = R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}
data: {synthetic: true, synthetic_vocab: 64}
training: {device: cpu, seq_len: 16, total_batch_tokens: 256, memory_fit: auto}
)";

// kTiny with `sets` ("key=value;key=value") applied as --set does.
Config tiny(const std::string& sets = "") {
  Config c = config_from_yaml(kTiny, "test");
  for (size_t start = 0; start < sets.size();) {
    const size_t end = std::min(sets.find(';', start), sets.size());
    apply_override(c, parse_override(sets.substr(start, end - start)));
    start = end + 1;
  }
  return c;
}

// A budget of `bytes` in GiB (memory_limit_gb is a float: within a byte at these sizes).
std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(bytes) / double(1ull << 30));
  return buf;
}

// Every combination's predicted total, under a budget that holds them all.
std::vector<FitCandidate> all_of(const std::string& extra = "") {
  Config c = tiny("training.memory_limit_gb=64" + (extra.empty() ? "" : ";" + extra));
  return rank_fits(c, 1).fitting;
}

// The code and message of the Error plan_with_fit throws for c (a failure when it throws none).
std::pair<int, std::string> fit_error(Config& c, bool dry_run = false) {
  try {
    plan_with_fit(c, 1, dry_run);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  ADD_FAILURE() << "plan_with_fit threw no error";
  return {0, ""};
}

int64_t tokens(const Config& c) {
  const TrainingConfig& t = c.training;
  return int64_t(t.micro_batch.size) * t.grad_accum * t.seq_len;
}

}  // namespace

TEST(MemoryFit, GenerousBudgetKeepsTheDefaults) {
  Config c = tiny("training.memory_limit_gb=1");
  const Plan p = plan_with_fit(c, 1);
  EXPECT_EQ(c.training.optimizer_state, "fp32");
  EXPECT_EQ(c.training.recompute, 0);
  EXPECT_EQ(c.training.master_weights, MasterWeights::fp32);
  EXPECT_EQ(c.training.micro_batch.size, 16);  // one micro-step: the fastest
  EXPECT_EQ(p.micro_batch, 16);
  EXPECT_EQ(p.grad_accum, 1);
  EXPECT_EQ(p.tokens_per_step, 256);
  EXPECT_THAT(p.memory_fit, ::testing::HasSubstr("chosen:    optimizer_state fp32, recompute 0, master_weights fp32, "
                                                 "micro_batch 16 x grad_accum 1"));
  EXPECT_THAT(p.memory_fit, ::testing::HasSubstr("runner-up: "));
}

TEST(MemoryFit, TightBudgetForcesInt8AndFullRecompute) {
  // a budget between the smallest int8 combination with recompute 3 and the smallest of the others
  size_t other = SIZE_MAX, forced = SIZE_MAX;
  for (const FitCandidate& k : all_of()) {
    const bool smallest_kind = k.optimizer_state == "int8" && k.recompute == 3;
    (smallest_kind ? forced : other) = std::min(smallest_kind ? forced : other, k.memory.total());
  }
  ASSERT_LT(forced, other);
  const size_t budget = (forced + other) / 2;
  Config c = tiny("training.memory_limit_gb=" + gib(budget));
  const Plan p = plan_with_fit(c, 1);
  EXPECT_EQ(c.training.optimizer_state, "int8");
  EXPECT_EQ(c.training.recompute, 3);
  EXPECT_EQ(p.recompute, 3);
  EXPECT_EQ(p.zero.state, optim::StateType::Int8);
  EXPECT_LE(predict_memory(p).total(), budget);
  // the global batch kept: micro-batch x accumulation x seq_len = total_batch_tokens
  EXPECT_EQ(p.tokens_per_step, 256);
  EXPECT_EQ(int64_t(p.micro_batch) * p.grad_accum * p.seq_len, 256);
  EXPECT_THAT(p.memory_fit, ::testing::HasSubstr("chosen:    optimizer_state int8, recompute 3"));
}

TEST(MemoryFit, GlobalBatchOfMicroBatchTimesAccumulationIsKept) {
  // no total_batch_tokens: the global batch is the default micro_batch (4) x grad_accum (1) x ranks
  Config c = config_from_yaml(R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}
data: {synthetic: true, synthetic_vocab: 64}
training: {device: cpu, seq_len: 16, memory_fit: auto, memory_limit_gb: 1}
)", "test");
  const int64_t before = tokens(c);
  const FitResult r = rank_fits(c, 1);
  EXPECT_EQ(r.considered, size_t(3 * 4 * 3));  // states x levels x micro-batches 4, 2, 1
  for (const FitCandidate& k : r.fitting) EXPECT_EQ(int64_t(k.micro_batch) * k.grad_accum * 16, before);
  plan_with_fit(c, 1);
  EXPECT_EQ(tokens(c), before);
}

TEST(MemoryFit, NothingFitsIsOutOfMemoryNamingTheSmallest) {
  size_t smallest = SIZE_MAX;
  for (const FitCandidate& k : all_of()) smallest = std::min(smallest, k.memory.total());
  Config c = tiny("training.memory_limit_gb=" + gib(smallest - 64));
  const auto [code, what] = fit_error(c);
  EXPECT_EQ(code, kExitOutOfMemory);
  EXPECT_THAT(what, ::testing::StartsWith("training.memory_fit: auto: no combination fits "
                                          "training.memory_limit_gb "));
  EXPECT_THAT(what, ::testing::HasSubstr("the smallest predicted total is " + format_bytes(double(smallest)) +
                                         ", with optimizer_state int8, recompute 3, master_weights fp32, "
                                         "micro_batch 1 x grad_accum 16"));
  EXPECT_EQ(c.training.optimizer_state, "fp32");  // the config untouched
}

TEST(MemoryFit, KeysTheConfigGivesAreKept) {
  // the state, the level and the micro-batch given: one combination
  Config c = tiny("training.memory_limit_gb=1;training.optimizer_state=bf16;training.recompute=1;"
                  "training.micro_batch=4");
  const FitResult r = rank_fits(c, 1);
  EXPECT_EQ(r.considered, 1u);
  EXPECT_THAT(r.kept, ::testing::ElementsAre("training.optimizer_state", "training.recompute", "training.micro_batch"));
  const Plan p = plan_with_fit(c, 1);
  EXPECT_EQ(c.training.optimizer_state, "bf16");
  EXPECT_EQ(c.training.recompute, 1);
  EXPECT_EQ(p.micro_batch, 4);
  EXPECT_EQ(p.grad_accum, 4);
  // a key given at its default value is kept too
  Config d = tiny("training.memory_limit_gb=1;training.recompute=0");
  for (const FitCandidate& k : rank_fits(d, 1).fitting) EXPECT_EQ(k.recompute, 0);
  // master_weights: none is never switched on
  Config m = tiny("training.memory_limit_gb=1;training.master_weights=false");
  plan_with_fit(m, 1);
  EXPECT_EQ(m.training.master_weights, MasterWeights::none);
}

TEST(MemoryFit, GpuPlanChoosesCompensatedMasterWhereFp32MasterCannotFit) {
  // planned for a GPU, as a dry run does on any machine: bf16 parameters, so master weights to choose
  Config all = tiny("training.device=cuda;training.offload=none;training.memory_limit_gb=64");
  const FitResult r = rank_fits(all, 1, true);
  EXPECT_EQ(r.considered, size_t(2 * 3 * 4 * 5));  // master kinds x states x levels x micro-batches 16..1
  EXPECT_EQ(r.fitting.front().master, MasterWeights::fp32);  // room for everything: the most precise
  size_t fp32_min = SIZE_MAX, comp_min = SIZE_MAX;
  for (const FitCandidate& k : r.fitting) {
    size_t& m = k.master == MasterWeights::fp32 ? fp32_min : comp_min;
    m = std::min(m, k.memory.total());
  }
  ASSERT_LT(comp_min, fp32_min);
  const size_t budget = (comp_min + fp32_min) / 2;  // for the allocations: the limit adds the CUDA runtime's
  Config c = tiny("training.device=cuda;training.offload=none;training.memory_limit_gb=" +
                  gib(budget + size_t(kCudaRuntimeBytes)));
  const Plan p = plan_with_fit(c, 1, true);
  EXPECT_EQ(c.training.master_weights, MasterWeights::compensated);
  EXPECT_EQ(p.master_weights, optim::MasterKind::Compensated);
  EXPECT_LE(predict_memory(p).total(), budget);
  EXPECT_THAT(p.memory_fit, ::testing::HasSubstr("master_weights compensated"));
}

TEST(MemoryFit, GpuPlanOffloadsTheOptimizerOnlyWhereNothingElseFits) {
  // on a GPU, training.offload is an axis too (the master weights and state leave the device); its update
  // runs on the host and over PCIe, so with room for everything it is not chosen
  Config all = tiny("training.device=cuda;training.memory_limit_gb=64");
  const FitResult r = rank_fits(all, 1, true);
  EXPECT_EQ(r.considered, size_t(2 * 2 * 3 * 4 * 5));  // offload x master kinds x states x levels x micro-batches
  EXPECT_EQ(r.fitting.front().offload, Offload::none);
  size_t on_min = SIZE_MAX, off_min = SIZE_MAX;
  double on_fastest = 1e30, off_fastest = 1e30;
  for (const FitCandidate& k : r.fitting) {
    const bool on = k.offload == Offload::optimizer;
    (on ? on_min : off_min) = std::min(on ? on_min : off_min, k.memory.total());
    (on ? on_fastest : off_fastest) = std::min(on ? on_fastest : off_fastest, k.step_s);
  }
  ASSERT_LT(on_min, off_min);
  EXPECT_GT(on_fastest, off_fastest);  // the host's update costs more than the device's
  const size_t budget = (on_min + off_min) / 2;
  Config c = tiny("training.device=cuda;training.memory_limit_gb=" + gib(budget + size_t(kCudaRuntimeBytes)));
  const Plan p = plan_with_fit(c, 1, true);
  EXPECT_EQ(c.training.offload, Offload::optimizer);
  EXPECT_TRUE(p.zero.offload);
  EXPECT_EQ(predict_memory(p).master + predict_memory(p).optim, 0u);
  EXPECT_LE(predict_memory(p).total(), budget);
  EXPECT_THAT(p.memory_fit, ::testing::HasSubstr("offload optimizer"));
  // given as none, it stays none: nothing fits that budget then
  Config kept = tiny("training.device=cuda;training.offload=none;training.memory_limit_gb=" +
                     gib(budget + size_t(kCudaRuntimeBytes)));
  EXPECT_EQ(fit_error(kept, true).first, kExitOutOfMemory);  // a budget only offload fits is not met without it
}

TEST(MemoryFit, GpuBudgetLeavesRoomForTheCudaRuntime) {
  // memory_limit_gb bounds the whole process: on a GPU the allocations get it less the CUDA context's and
  // the libraries' share; a limit the runtime alone exceeds fits nothing; the CPU keeps all of it
  Config all = tiny("training.device=cuda;training.memory_limit_gb=64");
  const FitResult r = rank_fits(all, 1, true);
  EXPECT_EQ(r.budget, 64.0 * double(1ull << 30) - kCudaRuntimeBytes);
  EXPECT_THAT(r.budget_text, ::testing::HasSubstr("less 1.50 GiB for the CUDA context and libraries"));
  size_t smallest = SIZE_MAX;
  for (const FitCandidate& k : r.fitting) smallest = std::min(smallest, k.memory.total());
  const size_t mib = size_t(1) << 20;  // memory_limit_gb is a float: a margin above its rounding
  Config tight = tiny("training.device=cuda;training.memory_limit_gb=" + gib(smallest + size_t(kCudaRuntimeBytes) - mib));
  EXPECT_EQ(fit_error(tight, true).first, kExitOutOfMemory);  // the smallest total fits the limit, not the rest
  Config ok = tiny("training.device=cuda;training.memory_limit_gb=" + gib(smallest + size_t(kCudaRuntimeBytes) + mib));
  EXPECT_LE(predict_memory(plan_with_fit(ok, 1, true)).total(), smallest + mib);
  EXPECT_EQ(allocation_budget(1e9, "cuda"), 1.0);
  EXPECT_EQ(allocation_budget(1e9, "cpu"), 1e9);
  EXPECT_EQ(allocation_budget(0, "cuda"), 0.0);
}

TEST(MemoryFit, SmallerLogitsChunkKeepsALargerMicroBatch) {
  // GPT-2 1558M in FP8 within 16 GiB (the whole process): the default chunk holds micro-batch 8's 8192 rows
  // of logits and does not fit beside the runtime, 1024 rows do, at micro-batch 4's memory but 8's speed
  auto fit = [](const std::string& more) {
    Config c = config_from_yaml(R"(
model: {preset: d48}
data: {synthetic: true, synthetic_vocab: 50257}
training: {device: cuda, precision: fp8, seq_len: 1024, total_batch_tokens: 16384, memory_fit: auto,
           memory_limit_gb: 16}
)", "test");
    if (!more.empty()) apply_override(c, {"training.logits_chunk", more}), c.set_keys.insert("training.logits_chunk");
    const Plan p = plan_with_fit(c, 1, true);
    return std::make_pair(c.training, p);
  };
  const auto [t, p] = fit("");
  EXPECT_EQ(t.logits_chunk, kFitLogitsChunk);
  EXPECT_EQ(p.logits_chunk, kFitLogitsChunk);
  EXPECT_EQ(t.micro_batch.size, 8);
  EXPECT_LE(double(predict_memory(p).total()) + kCudaRuntimeBytes, 16.0 * double(1ull << 30));
  EXPECT_THAT(p.memory_fit, ::testing::HasSubstr("logits_chunk 1024, micro_batch 8 x grad_accum 2"));
  // given, the chunk is kept: the default's micro-batch 8 does not fit, so the split goes down
  const auto [tk, pk] = fit("0");
  EXPECT_EQ(tk.logits_chunk, 0);
  EXPECT_EQ(pk.logits_chunk, 8192);
  EXPECT_LT(tk.micro_batch.size, 8);
}

TEST(MemoryFit, BudgetIsNeededOnTheCpuAndMaxIsRefused) {
  Config c = tiny();
  const auto [code, what] = fit_error(c);
  EXPECT_EQ(code, kExitBadInput);
  EXPECT_THAT(what, ::testing::StartsWith("config error: training.memory_limit_gb: training.memory_fit: auto on "
                                          "the CPU needs it > 0"));
  Config m = config_from_yaml(R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}
data: {synthetic: true, synthetic_vocab: 64}
training: {device: cpu, seq_len: 16, micro_batch: max, memory_fit: auto, memory_limit_gb: 1}
)", "test");
  EXPECT_THROW_WITH(plan_with_fit(m, 1), "training.micro_batch: 'max' cannot be combined with training.memory_fit: auto");
  // off: the config as given
  Config off = tiny("training.memory_fit=off");
  EXPECT_EQ(plan_with_fit(off, 1).memory_fit, "");
  EXPECT_EQ(off.training.micro_batch.size, 4);
}

// The model reproduces the H100 step times its constants were fitted to (memory_fit.hpp), within 1%.
TEST(MemoryFit, StepModelMatchesItsCalibration) {
  auto ms = [](const std::string& preset, int B, int accum, int recompute, const char* precision,
               std::vector<Override> more = {}) {
    Config c;
    for (const auto& kv : more) apply_override(c, kv);
    apply_override(c, {"model.preset", preset});
    apply_override(c, {"data.synthetic", "true"});
    apply_override(c, {"training.device", "cuda"});
    apply_override(c, {"training.seq_len", "1024"});
    apply_override(c, {"training.micro_batch", std::to_string(B)});
    apply_override(c, {"training.grad_accum", std::to_string(accum)});
    apply_override(c, {"training.recompute", std::to_string(recompute)});
    apply_override(c, {"training.precision", precision});
    return predicted_step_s(make_plan(c, 1, true)) * 1e3;
  };
  EXPECT_NEAR(ms("d48", 16, 1, 0, "bf16"), 314.5, 3.1);
  EXPECT_NEAR(ms("d48", 1, 16, 2, "bf16"), 468.0, 4.7);
  EXPECT_NEAR(ms("d12", 64, 1, 0, "bf16"), 107.0, 1.1);
  EXPECT_NEAR(ms("d48", 16, 1, 0, "fp8"), 224.7, 2.2);
  // the optimizer offloaded (memory_fit's choice in 12 GiB with master weights kept, on the machine whose host
  // rates kHostSecondsPerParam holds): 1933.5 ms measured, of which the host's update 1524-1757
  // (bench/RESULTS.md, 2026-12-07, noon); the device's share is the model's, hence 5%
  EXPECT_NEAR(ms("d48", 8, 2, 3, "fp8", {{"training.optimizer_state", "fp32"}, {"training.offload", "optimizer"}}),
              1933.5, 97.0);
  // and there fp32 state is the faster to update on the host: its bytes cost less than bf16's conversions
  EXPECT_LT(ms("d48", 8, 2, 3, "fp8", {{"training.optimizer_state", "fp32"}, {"training.offload", "optimizer"}}),
            ms("d48", 8, 2, 3, "fp8", {{"training.optimizer_state", "bf16"}, {"training.offload", "optimizer"}}));
  // and orders what it is for: fewer micro-steps faster, recompute slower, full-block recompute by ~1/3
  EXPECT_LT(ms("d48", 16, 1, 0, "bf16"), ms("d48", 8, 2, 0, "bf16"));
  EXPECT_LT(ms("d48", 16, 1, 1, "bf16"), ms("d48", 16, 1, 3, "bf16"));
  EXPECT_NEAR(ms("d48", 16, 1, 3, "bf16") / ms("d48", 16, 1, 0, "bf16"), 1.31, 0.03);
}

// A run on a GPU weighs offload by its host update measured on the machine (host_update_s_per_param):
// the offloaded step is the device's share, the PCIe copies and exactly the measured time per parameter
// times the parameters this rank updates; without offload the measurement is not read.
TEST(MemoryFit, OffloadWeighsTheHostUpdateMeasuredHere) {
  Config c;
  for (const auto& [k, v] : std::vector<Override>{{"model.preset", "d12"},
                                                   {"data.synthetic", "true"},
                                                   {"training.device", "cuda"},
                                                   {"training.seq_len", "1024"},
                                                   {"training.micro_batch", "8"},
                                                   {"training.offload", "optimizer"}})
    apply_override(c, {k, v});
  const Plan p = make_plan(c, 1, true);
  ASSERT_TRUE(p.zero.offload);
  const double n = double(p.n_params), pcie = 2 * 2 * n / kPcie;
  const double model = predicted_step_s(p), slow = predicted_step_s(p, 4e-9), fast = predicted_step_s(p, 1e-9);
  EXPECT_NEAR(slow - fast, 3e-9 * n, 1e-9 * (slow - fast));
  const double device = fast - 1e-9 * n - pcie;  // the same share however the host runs
  EXPECT_GT(device, 0);
  EXPECT_NEAR(model - device - pcie, kHostSecondsPerParam[int(p.zero.state)] * n, 1e-6 * model);  // a dry run's
  apply_override(c, {"training.offload", "none"});
  const Plan q = make_plan(c, 1, true);
  EXPECT_EQ(predicted_step_s(q, 4e-9), predicted_step_s(q));

  // the probe runs the update itself for every state type and master kind (a time a parameter, positive
  // and far below a microsecond: not a measurement of this machine, which the benchmarks make)
  for (optim::StateType st : {optim::StateType::F32, optim::StateType::BF16, optim::StateType::Int8})
    for (optim::MasterKind mk : {optim::MasterKind::F32, optim::MasterKind::Compensated, optim::MasterKind::None}) {
      const double t = host_update_s_per_param(*make_optimizer("lion", true, st), mk, size_t(1) << 16);
      EXPECT_GT(t, 0) << optim::state_type_name(st);
      EXPECT_LT(t, 1e-6) << optim::state_type_name(st);
    }
}
