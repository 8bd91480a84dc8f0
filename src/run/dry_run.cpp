#include "run/dry_run.hpp"

#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "io/data.hpp"
#include "io/modelfile.hpp"
#include "run/eval.hpp"
#include "run/max_batch.hpp"
#include "run/memory_fit.hpp"
#include "run/plan.hpp"
#include "run/resume.hpp"

namespace gpt {

namespace {

constexpr const char* kZeroOneRank =
    "planned for 1 rank, where ZeRO stages 1-3 divide nothing: plan for the ranks the run will have with "
    "`mpirun -np N ./train ... --dry-run`";

// The budget a point's predicted allocations are checked against: training.memory_limit_gb, else the GPU's
// memory when this machine has the GPU the plan is for, less on a GPU what the CUDA context and libraries
// take (run/memory_fit.hpp); 0 = unknown.
double budget_bytes(const Config& c, const Plan& p) {
  if (c.training.memory_limit_gb > 0) return allocation_budget(double(c.training.memory_limit_gb) * double(1ull << 30), p.device);
  return p.device == "cuda" ? allocation_budget(double(cuda_device_caps(0).memory), p.device) : 0.0;
}

// Every shard of the point's data globs opened and its header checked, as the run will; one line per
// distinct glob. B and T size the check that each shard holds a global micro-batch.
void check_data(const Config& c, const Plan& p, std::map<std::string, std::string>& seen) {
  if (c.data.synthetic) return;
  if (c.data.train.empty())
    throw input_error("config error: data.train: give a glob of token shards or synthetic: true");
  const int B = p.micro_batch > 0 ? p.micro_batch : 1;
  for (const auto& [what, glob] : {std::pair<const char*, std::string>{"train", c.data.train}, {"val", c.data.val}}) {
    if (glob.empty() || seen.count(glob)) continue;
    try {
      seen[glob] = std::string(what) + " data: " +
                   make_shard_source(glob, B, p.seq_len, 0, p.world, p.model.dims.vocab_size)->describe() + " (" + glob + ")";
    } catch (const Error& e) {
      throw input_error("data." + std::string(what) + ": " + e.what());
    }
  }
}


// micro_batch: max in a dry run: the largest size whose predicted memory is within the budget (on a GPU
// the run also tries it, so it may find less); 0 when there is no budget to search against.
int predicted_max(Plan p, double budget, HostComm& host) {
  if (budget <= 0) return 0;
  try {
    // by prediction alone: every size the prediction allows is taken to run (on a GPU the prediction
    // includes the backend's own memory, cuDNN's attention workspace growing with the micro-batch)
    return find_max_micro_batch(p, budget, host, [](int) { return true; });
  } catch (const Error& e) {
    if (e.code() != kExitOutOfMemory) throw;
    return 0;
  }
}

}  // namespace

void dry_run(const Config& base, const Sweep& sw, const std::vector<int>& indices, HostComm& host) {
  InputsChecked checked;
  std::map<std::string, int> notes;
  std::ostringstream table;
  char buf[512];
  const bool as_table = sw.is_sweep && indices.size() > 1;  // --index I: that point's whole plan
  if (as_table) {
    std::snprintf(buf, sizeof buf, "%-5s %-5s %-12s %-6s %-5s %-11s %12s %5s  %s\n", "point", "dir", "model", "device",
                  "ZeRO", "micro-batch", "per rank", "fits", "values");
    table << buf;
  }
  for (int i : indices) {  // every point planned (and so validated) before saying yes
    const SweepPoint& pt = sw.points[i];
    Config c = point_config(base, sw, pt);
    Plan plan = plan_with_fit(c, host.world(), true);
    check_inputs(c, plan, checked);
    const double budget = budget_bytes(c, plan);
    std::string mb = std::to_string(plan.micro_batch);
    if (plan.micro_batch_max) {
      const int B = predicted_max(plan, budget, host);
      mb = B > 0 ? "max->" + std::to_string(B) : "max";
      if (B > 0) plan = with_micro_batch(plan, B);
    }
    // --resume: the run directory's log and checkpoint checked as the resume checks them
    std::string resume;
    if (c.checkpoint.resume == ResumeMode::automatic) {
      try {
        resume = check_resume(c, plan);
      } catch (const Error& e) {
        if (!sw.is_sweep) throw;
        throw Error(e.code(), "sweep point " + std::to_string(pt.index) + " (" + c.run.name + "): " + e.what());
      }
    }
    if (!plan.device_note.empty()) notes[plan.device_note] = 1;
    // ZeRO divides state among ranks: planned for one rank, stages 1-3 only add their buffers
    const std::string zero = host.world() == 1 && plan.zero.stage > 0 ? kZeroOneRank : "";
    if (host.rank() != 0) continue;
    if (!as_table) {
      print_plan(c, plan);
      if (!zero.empty()) std::cout << "(" << zero << ")\n";
      if (!resume.empty()) std::cout << resume << "\n";
      continue;
    }
    if (!zero.empty()) notes[zero] = 1;
    if (!resume.empty()) notes["point " + std::to_string(pt.index) + ": " + resume] = 1;
    if (!plan.memory_fit.empty()) {  // its first two lines, the budget and the choice, as one
      std::string fit = plan.memory_fit.substr(0, plan.memory_fit.find('\n', plan.memory_fit.find('\n') + 1));
      fit.replace(fit.find('\n'), 1, "; ");
      notes["point " + std::to_string(pt.index) + ": " + fit] = 1;
    }
    const double total = double(predict_memory(plan).total());
    const std::string fits = budget > 0 ? (total <= budget ? "yes" : "NO") : "n/a";
    std::snprintf(buf, sizeof buf, "%-5d %-5s %-12s %-6s %-5d %-11s %12s %5s  %s\n", pt.index, pt.dir_name.c_str(),
                  (std::to_string(plan.model.dims.n_layer) + "x" + std::to_string(plan.model.dims.n_embd)).c_str(),
                  plan.device.c_str(), plan.zero.stage, mb.c_str(), format_bytes(total).c_str(), fits.c_str(),
                  [&] {
                    std::string v;
                    for (auto& kv : pt.values) v += (v.empty() ? "" : " ") + kv.key + "=" + kv.value;
                    return v;
                  }().c_str());
    table << buf;
  }
  if (host.rank() != 0) return;
  if (as_table)
    std::cout << "sweep " << base.run.name << ": " << indices.size() << " point(s), " << host.world()
              << " rank(s); fits: predicted memory per rank within training.memory_limit_gb, or the GPU's memory "
                 "when that GPU is here, on a GPU less "
              << format_bytes(kCudaRuntimeBytes)
              << " for the CUDA context and libraries (n/a: neither known); one point's whole plan: --dry-run --index I\n"
              << table.str();
  if (as_table)
    for (auto& n : notes) std::cout << "(" << n.first << ")\n";
  for (auto& [glob, line] : checked.data_lines) std::cout << line << "\n";
  std::cout << std::flush;
}

void check_inputs(const Config& c, const Plan& p, InputsChecked& seen) {
  check_data(c, p, seen.data_lines);
  check_eval_inputs(c, p, seen.files);  // validation shards' tokens, HellaSwag file, vocabulary, prompt
  // a resumed run takes its parameters from the checkpoint, not from init_from
  const ModelDims& d = p.model.dims;
  const std::string dims = std::to_string(d.n_layer) + " " + std::to_string(d.n_head) + " " + std::to_string(d.n_embd) +
                           " " + std::to_string(d.vocab_size) + " " + std::to_string(d.max_seq_len);
  if (!c.model.init_from.empty() && c.checkpoint.resume != ResumeMode::automatic &&
      seen.files.insert("init_from\n" + c.model.init_from + "\n" + dims).second)
    check_model_file(c.model.init_from, d);
}

}  // namespace gpt
