// Checkpoints: the full training state in HDF5, one file per rank, written atomically.
//   <run dir>/checkpoints/step_NNNNNNNN/rank_RRRRR.h5   each rank's pieces of every bucket
//   <run dir>/checkpoints/latest                        name of the newest complete checkpoint (for people
//                                                       and tools; resuming takes the newest loadable folder)
// A checkpoint is written into step_NNNNNNNN.tmp/, every file fsynced, then the folder is renamed
// and `latest` replaced (temp file + rename); old ones are renamed to *.deleting before removal. So a
// folder named step_NNNNNNNN is always complete, and a kill at any moment leaves the previous one intact.
// Last into the folder before its rename goes MANIFEST: every rank file's size and XXH3-64 hash, checked
// before HDF5 opens any file, so damage anywhere (data, metadata, HDF5's own structures) is found and the
// previous checkpoint tried instead.
// Each piece records the logical range [begin, end) of its bucket it covers (stage 0, where every rank
// holds everything, writes an equal slice per rank), so a checkpoint written by N ranks at stage k loads
// on M ranks at stage j by re-slicing. Every dataset carries an XXH3-64 checksum of its bytes.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "dist/agree.hpp"
#include "dist/comm.hpp"
#include "io/data.hpp"
#include "dist/zero.hpp"

namespace gpt {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  DataPosition data;         // train data position after those steps
  uint64_t seed = 0;         // run seed (data order and stochastic rounding derive from seed + step)
  std::string config_yaml;
  int64_t world = 0;         // on load: the world size that wrote it
};

// A checkpoint that loads but does not fit this run (see check_resumable): an error, never a reason to
// fall back to an older checkpoint.
class ResumeMismatch : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// Collective: every rank writes its file (before_write runs first, on every rank: a testing hook);
// rank 0 writes the manifest and publishes. Keeps the newest keep_last checkpoints. A failure anywhere is
// an AgreedError on every rank, and the previous checkpoints are untouched.
void save_checkpoint(const std::string& run_dir, const TrainState& st, ZeroEngine& engine, const ParamLayout& layout,
                     HostComm& host, int keep_last, const std::function<void()>& before_write = {});

// <run dir>/checkpoints/step_NNNNNNNN: where the checkpoint of a step lives.
std::string checkpoint_dir(const std::string& run_dir, int64_t step);

// The run's newest complete checkpoint folder ("" when it has none).
std::string latest_checkpoint(const std::string& run_dir);
// The checkpoint folder meant by a run directory, its checkpoints/ folder, its `latest` file or a step
// folder: the step folder itself, else the newest complete one. Input error naming the path otherwise.
std::string resolve_checkpoint(const std::string& path);

// Complete checkpoints of a run, newest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Called with a checkpoint's state (step, data position, config, world) before its tensors are read;
// throws ResumeMismatch when the run cannot continue from it.
using AcceptCheckpoint = std::function<void(const TrainState&)>;

// Collective: loads one checkpoint folder into the engine (any world size / stage). Throws a named
// input error (agreed) on a corrupt or mismatched checkpoint.
TrainState load_checkpoint(const std::string& ckpt_dir, ZeroEngine& engine, const ParamLayout& layout, HostComm& host,
                           const AcceptCheckpoint& accept = {});

// Collective: the newest loadable checkpoint of the run (falling back past broken ones, saying so);
// returns false when the run has none.
bool load_latest_checkpoint(const std::string& run_dir, ZeroEngine& engine, const ParamLayout& layout,
                            HostComm& host, TrainState& out, const AcceptCheckpoint& accept = {});

// Reads the whole model's parameters (logical layout, fp32: the master weights where the checkpoint has
// them) from a checkpoint folder, on one process.
std::vector<float> read_checkpoint_params(const std::string& ckpt_dir, const ParamLayout& layout);
// The config a checkpoint was written with.
std::string read_checkpoint_config(const std::string& ckpt_dir);

}  // namespace gpt
