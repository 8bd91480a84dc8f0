// What may change when a run resumes, and what may not. May change: the length of the run
// (training.steps, but not to below the step it has reached), the optimizer's hyperparameters and
// schedule, evaluation, logging and checkpointing settings, the device, precision, ZeRO stage,
// recomputation, and the world size and micro-batch so long as the tokens per step stay the same (the
// checkpoint is resharded). May not: the model, run.seed, training.seq_len, the tokens per optimizer step
// (micro_batch x seq_len x grad_accum x world size), and the training data (data.train, data.synthetic
// and its settings, and the files data.train matches, unless data.allow_changed_files): the data position,
// the random streams and the schedule assume them. docs/FORMATS.md lists the same, and what --resume
// does in each state a run directory can be in.
#pragma once
#include <string>

#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "io/runlog.hpp"
#include "run/plan.hpp"

namespace gpt {

// Throws ResumeMismatch naming every setting that differs where it may not between `now` and the run
// that `old` describes (a checkpoint, or a completed run's log: `what` names it, "the checkpoint of step
// 20"), or saying that training.steps is below old's step. `files_now`: data_files_text of this run.
// Returns a warning to print ("" if none): files that changed under data.allow_changed_files.
std::string check_resumable(const Config& now, const Plan& plan, const TrainState& old, const std::string& files_now,
                            const std::string& what);

// What data.train matches, for checkpoints and the log: one line per file in glob order, "SIZE XXH3 PATH",
// the hash of the file's first and last MiB (a cheap fingerprint: read at every start). Empty for the
// synthetic corpus.
std::string data_files_text(const DataConfig& data);

// --resume, on rank 0 under the run directory's lock, before any work: what the earlier run in dir left
// (its log.h5 and checkpoints) decides what happens (docs/FORMATS.md, "Resuming").
struct EarlierRun {
  LoggedRun log;
  bool has_checkpoint = false;  // a complete checkpoints/step_N folder
  int64_t complete_at = -1;     // a completed run with nothing left to train: its last step (a no-op)
};
// A completed run (log status ok) with the same training.steps is a no-op, fewer steps are refused, and
// more are refused without a checkpoint to continue from. A damaged log.h5 is named. input_error (exit 1).
EarlierRun check_earlier_run(const std::string& dir, int steps);

// --resume --dry-run: what the resume would decide, by the checks it makes, touching nothing: the earlier
// run (check_earlier_run), then the newest usable checkpoint (read_checkpoint_state, falling back past
// damaged ones as the resume does) against this config (check_resumable). Throws what the resume would
// refuse with; returns what it would do ("continues from ...", for the dry run to print).
std::string check_resume(const Config& cfg, const Plan& plan);

}  // namespace gpt
