// What may change when a run resumes, and what may not. May change: the length of the run
// (training.steps), the optimizer's hyperparameters and schedule, evaluation, logging and
// checkpointing settings, the device, precision, ZeRO stage, recomputation, and the world size and
// micro-batch so long as the tokens per step stay the same (the checkpoint is resharded). May not:
// the model, run.seed, training.seq_len, the tokens per optimizer step (micro_batch x seq_len x
// grad_accum x world size), and the training data (data.train, data.synthetic and its settings): the
// data position, the random streams and the schedule assume them. docs/FORMATS.md lists the same.
#pragma once
#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "run/plan.hpp"

namespace gpt {
// Throws ResumeMismatch naming every setting that differs from the checkpoint's where it may not.
void check_resumable(const Config& now, const Plan& plan, const TrainState& checkpoint);
}  // namespace gpt
