// Checkpoints: the full training state in HDF5, one file per rank, written atomically.
//   <run dir>/checkpoints/step_NNNNNNNN/rank_RRRRR.h5   each rank's pieces of every bucket
//   <run dir>/checkpoints/latest                        name of the newest complete checkpoint (for people
//                                                       and tools; resuming takes the newest loadable folder)
// A checkpoint is written into step_NNNNNNNN.tmp/, every file fsynced, then the folder is renamed
// and `latest` replaced (temp file + rename); old ones are renamed to *.deleting before removal. So a
// folder named step_NNNNNNNN is always complete, and a kill at any moment leaves the previous one intact.
// Last into the folder before its rename goes MANIFEST: every rank file's size and XXH3-64 hashes
// (MANIFEST 2: the hashes of byte ranges tiling each file), so damage anywhere (data, metadata, HDF5's own
// structures) is found and the previous checkpoint tried instead: the metadata ranges are checked before
// HDF5 opens a file, the datasets' as they are read.
// Each piece records the logical range [begin, end) of its bucket it covers (stage 0, where every rank
// holds everything, writes an equal slice per rank), so a checkpoint written by N ranks at stage k loads
// on M ranks at stage j by re-slicing.
// Writing (io/checkpoint_writer.hpp): a snapshot of the state in host memory (io/snapshot.hpp), the
// file's structure made with HDF5 on the main thread (contiguous datasets placed early), then the
// datasets' bytes written with pwrite by several threads in the background, so training goes on meanwhile.
// Reading (checkpoint_read.cpp): HDF5 reads the structure; the datasets' bytes are read once, with pread
// on several threads at the offsets HDF5 gives, each range hashed as it arrives.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "parallel/agree.hpp"
#include "parallel/comm.hpp"
#include "io/data.hpp"
#include "model/fp8_scaling.hpp"
#include "model/spec.hpp"
#include "io/manifest.hpp"
#include "io/raw_io.hpp"
#include "io/snapshot.hpp"
#include "parallel/sharded_state.hpp"
#include "parallel/zero_policy.hpp"

namespace gpt {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  DataPosition data;         // train data position after those steps
  uint64_t seed = 0;         // run seed (data order and stochastic rounding derive from seed + step)
  std::string config_yaml;
  std::string data_files;    // what data.train matched (run/resume.hpp's data_files_text); "" when not recorded
  int64_t world = 0;         // on load: the world size that wrote it
  Fp8Scaling::State fp8;     // precision fp8: the scales and amax histories by name; empty otherwise
  // which products ran in FP8 (model/spec.hpp: precision_attrs); on load empty for a checkpoint written
  // before it was recorded
  std::vector<PrecisionAttr> precision;
};

// A checkpoint that loads but does not fit this run (another model, or see check_resumable): an error,
// never a reason to fall back to an older checkpoint.
class ResumeMismatch : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

inline constexpr const char* kCheckpointFormat = "gpt2-train checkpoint";
// 4: an int8 optimizer slot as it is held, its codes (uint8, attributes `code` and `block_size`) and its
// blocks' scales (fp32, dataset `<slot>.scales`). 3 (still read; int8 slots as the fp32 values the codes
// stand for): the datasets' hashes in the MANIFEST (version 2), by ranges of at most 64 MiB. 2 (still
// read, with a MANIFEST of version 1): each dataset's XXH3-64 in its `checksum` attribute. 1: not read.
inline constexpr int64_t kCheckpointVersion = 4;
inline constexpr const char* kScalesSuffix = ".scales";  // an int8 slot's block scales: dataset "<slot>.scales"

// Creates the rank file at path with HDF5, its datasets placed but unwritten; returns where their bytes
// go (write them with write_regions, from any thread: HDF5 is done with the file).
std::vector<Region> lay_out_rank_file(const std::string& path, const TrainState& st, const Snapshot::Copies& c,
                                      const ParamLayout& layout, int zero_stage, int rank, int world);
std::string rank_file(const std::string& dir, int rank);  // dir/rank_RRRRR.h5

// The steps of a save (io/checkpoint_writer.hpp runs them). Collective: rank 0 makes
// <run dir>/checkpoints/step_NNNNNNNN.tmp (agreed); returns its path.
std::string prepare_checkpoint_dir(const std::string& run_dir, int64_t step, HostComm& host);
// After a failure agreed by every rank: rank 0 removes the .tmp folder; the previous checkpoints stay.
void abandon_checkpoint(const std::string& tmp, HostComm& host);
// Collective, once every rank's file is written, synced and hashed: rank 0 writes the MANIFEST, renames
// the folder, replaces `latest`, and keeps the newest keep_last. A failure is an AgreedError on every rank.
void publish_checkpoint(const std::string& run_dir, int64_t step, const FileDigest& mine, HostComm& host,
                        int keep_last);

// <run dir>/checkpoints/step_NNNNNNNN: where the checkpoint of a step lives.
std::string checkpoint_dir(const std::string& run_dir, int64_t step);
// "24.923 GB in 18.42 s (1.35 GB/s)": the size of step's checkpoint folder (every rank's file) over sec.
std::string checkpoint_size_text(const std::string& run_dir, int64_t step, double sec);

// The run's newest complete checkpoint folder ("" when it has none).
std::string latest_checkpoint(const std::string& run_dir);
// The checkpoint folder meant by a run directory, its checkpoints/ folder, its `latest` file or a step
// folder: the step folder itself, else the newest complete one. Input error naming the path otherwise.
std::string resolve_checkpoint(const std::string& path);
// Calls read(dir) with the checkpoint folder `path` means (resolve_checkpoint). A live run's keep_last may
// delete that folder while it is read: when `path` names a run (not one step folder) and read fails
// while its folder is gone, the newest checkpoint is found again and read from, with a note on stderr; an
// error about a folder still there is read's own.
void read_resolved_checkpoint(const std::string& path, const std::function<void(const std::string& dir)>& read);

// Complete checkpoints of a run, newest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Called with a checkpoint's state (step, data position, config, world) before its tensors are read;
// throws ResumeMismatch when the run cannot continue from it.
using AcceptCheckpoint = std::function<void(const TrainState&)>;

// Collective: loads one checkpoint folder into the engine (any world size / stage), reading with `threads`
// threads. Throws a named input error (agreed) on a corrupt or mismatched checkpoint.
TrainState load_checkpoint(const std::string& ckpt_dir, ShardedState& engine, const ParamLayout& layout, HostComm& host,
                           const AcceptCheckpoint& accept = {}, int threads = 4);

// Collective: the newest loadable checkpoint of the run (falling back past broken ones, saying so);
// returns false when the run has none.
bool load_latest_checkpoint(const std::string& run_dir, ShardedState& engine, const ParamLayout& layout,
                            HostComm& host, TrainState& out, const AcceptCheckpoint& accept = {}, int threads = 4);

// A checkpoint folder's state (step, data position, config, world) as load_checkpoint reads it, on one
// process and without its tensors (a dry run's --resume): input_error when damaged, ResumeMismatch
// when it holds another model than layout's.
TrainState read_checkpoint_state(const std::string& ckpt_dir, const ParamLayout& layout, int threads = 4);
// Reads the whole model's parameters (logical layout, fp32: the master weights where the checkpoint has
// them) from a checkpoint folder, on one process.
std::vector<float> read_checkpoint_params(const std::string& ckpt_dir, const ParamLayout& layout, int threads = 4);
// The config a checkpoint was written with.
std::string read_checkpoint_config(const std::string& ckpt_dir);

}  // namespace gpt
