// Sweeps: a `sweep:` section in the experiment YAML with `grid:` (cartesian product over dotted
// keys) and `zip:` (lists varied together), combinable. Each point is a run in <out_dir>/<name>/pNNN.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "parallel/comm.hpp"
#include "config/config_io.hpp"
#include "run/plan.hpp"

namespace gpt {

struct SweepPoint {
  int index = 0;
  std::string dir_name;                // pNNN
  std::vector<Override> values;        // the varied keys of this point
  std::string values_text() const;     // "key=value" lines
};

struct Sweep {
  bool is_sweep = false;
  std::vector<std::string> keys;       // varied keys, grid keys then zip keys
  std::vector<SweepPoint> points;      // one point with no values when the YAML has no sweep
};

// Parses the `sweep:` section; unknown keys, unequal zip lengths and empty lists are named errors.
Sweep parse_sweep(const std::string& yaml_text, const std::string& source);
// The config of one point: base config, then command-line overrides, then the point's values.
Config point_config(const Config& base, const Sweep& sw, const SweepPoint& p);

// A point ready to run: its config, validated and planned once.
struct PlannedPoint {
  int index = 0;
  Config cfg;
  Plan plan;
};
// Plans every given point before any work (so a bad value in any point is an error before the first
// runs; their inputs were checked before: run/dry_run.hpp's check_inputs) and checks that each point's
// run directory may be written (--resume, run.overwrite).
std::vector<PlannedPoint> plan_points(const Config& base, const Sweep& sw, const std::vector<int>& indices,
                                      HostComm& host, bool resume);
// Runs the planned points in turn in this process (all ranks together), recording failures (out of
// memory, divergence) and going on; rank 0 then writes the summary. Returns the process exit status.
int run_sweep(const Config& base, const Sweep& sw, const std::vector<PlannedPoint>& points, HostComm& host,
              bool resume, const std::string& yaml_text);
// What a point whose ranks shared GPUs (parallel.shared_gpu: host; the run log's `shared_gpu`) adds to
// its summary's `message` and to its line at the end of the sweep.
inline constexpr const char* kSharedGpuNote =
    "throughput not representative: collectives staged through host memory (parallel.shared_gpu: host)";
// (Re)writes <out_dir>/<name>/summary.{h5,csv} from the points' logs and prints a line naming them. A log
// HDF5 cannot read makes its point's status "damaged" (a warning on stderr names the file), and the others
// are summarized; a stop signal (run/signals.hpp) ends it before the files are written.
void write_summary(const Config& base, const Sweep& sw, const std::string& yaml_text);

}  // namespace gpt
