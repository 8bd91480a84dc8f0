#include "run/resume.hpp"

#include "config/config_io.hpp"

namespace gpt {

namespace {
std::string quoted(const std::string& s) { return "'" + s + "'"; }

// The tokens per optimizer step a config and world size make (micro_batch resolved, as checkpoints store it).
int64_t tokens_per_step(const TrainingConfig& t, int64_t world) {
  if (t.total_batch_tokens > 0) return t.total_batch_tokens;
  return int64_t(t.micro_batch.size) * t.seq_len * t.grad_accum * world;
}
}  // namespace

void check_resumable(const Config& now, const Plan& plan, const TrainState& ck) {
  const Config old = config_from_yaml(ck.config_yaml, "the checkpoint's config");
  std::string diffs;
  auto same = [&](const char* key, const std::string& was, const std::string& is) {
    if (was != is) diffs += std::string("\n  ") + key + " was " + was + " and is " + is + " now";
  };
  same("run.seed", std::to_string(old.run.seed), std::to_string(now.run.seed));
  same("training.seq_len", std::to_string(old.training.seq_len), std::to_string(now.training.seq_len));
  same("tokens per step (micro_batch x seq_len x grad_accum x world size)",
       std::to_string(tokens_per_step(old.training, ck.world)), std::to_string(plan.tokens_per_step));
  same("data.train", quoted(old.data.train), quoted(now.data.train));
  same("data.synthetic", old.data.synthetic ? "true" : "false", now.data.synthetic ? "true" : "false");
  if (now.data.synthetic) {
    same("data.synthetic_vocab", std::to_string(old.data.synthetic_vocab), std::to_string(now.data.synthetic_vocab));
    same("data.synthetic_branching", std::to_string(old.data.synthetic_branching),
         std::to_string(now.data.synthetic_branching));
  }
  if (!diffs.empty())
    throw ResumeMismatch(kExitBadInput, "cannot resume from the checkpoint of step " + std::to_string(ck.step) +
                                            ": settings that may not change on resume differ (docs/FORMATS.md)" +
                                            diffs);
}

}  // namespace gpt
