#include "cli/app.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <iostream>

#include "config/config_io.hpp"
#include "parallel/agree.hpp"
#include "run/dry_run.hpp"
#include "run/memory_fit.hpp"
#include "run/sweep.hpp"

namespace po = boost::program_options;

namespace gpt {
namespace {

const char* kUsage =
    "usage:\n"
    "  train --yaml FILE [--set key.path=value | key.path=value]... [--dry-run] [--list] [--index I] [--resume]\n"
    "        [--summarize]\n"
    "  train --config-reference            every config key, its type, default and meaning (docs/CONFIG.md)\n"
    "  train sample --ckpt DIR [--prompt-ids 50256,...] [--tokens N] [--temperature T] [--seed S]\n"
    "               [--logits FILE [--force]]\n"
    "  train export --ckpt DIR --out PATH [--format llmc|hf] [--dtype fp32|bf16] [--force]\n"
    "  (DIR: a run directory, its checkpoints/ or checkpoints/latest, or a checkpoints/step_N folder)\n"
    "Exit status: 0 ok, 1 bad input, 2 training failure, 3 out of memory, 75 checkpointed (resume me);\n"
    "see docs/FORMATS.md. File layouts: docs/FORMATS.md.\n";

void print_points(const Config& base, const Sweep& sw) {
  for (auto& p : sw.points) {
    std::cout << p.index << "\t" << (sw.is_sweep ? p.dir_name : base.run.name) << "\t";
    for (size_t i = 0; i < p.values.size(); ++i) std::cout << (i ? " " : "") << p.values[i].key << "=" << p.values[i].value;
    std::cout << "\n";
  }
}

struct CommandLine {
  std::string yaml;
  std::vector<std::string> sets;  // key.path=value, from --set and bare words
  int index = -1;
  bool index_given = false, help = false, reference = false, dry_run = false, list = false, resume = false,
       summarize = false;
};

po::options_description train_options(CommandLine& cl) {
  po::options_description opts("train");
  opts.add_options()("help,h", "this help")("yaml", po::value(&cl.yaml), "experiment YAML (a run or a sweep)")(
      "set", po::value(&cl.sets)->composing(), "override one key: key.path=value (repeatable)")(
      "dry-run", "validate, check the files a run reads, print the resolved config and predicted memory, and exit")(
      "list", "print the sweep's points and exit")("index", po::value(&cl.index), "run only sweep point I")(
      "resume", "continue from the latest valid checkpoint (checkpoint.resume: auto)")(
      "summarize", "rewrite the sweep summary from the points' logs and exit")(
      "config-reference", "print every config key with its type, default and meaning (docs/CONFIG.md) and exit");
  return opts;
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine cl;
  // A bare `key.path=value` (the Hydra habit) is an override like --set; any other bare word is an error,
  // never silently dropped.
  std::vector<std::string> bare;
  po::options_description all = train_options(cl);
  all.add_options()("override", po::value(&bare)->composing());
  po::positional_options_description pos;
  pos.add("override", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw input_error(std::string(e.what()) + " (see --help)");
  }
  for (const std::string& b : bare) {
    if (b.find('=') == std::string::npos || b.find('=') == 0)
      throw input_error("unexpected argument '" + b + "': give the experiment with --yaml FILE and overrides as "
                        "key.path=value or --set key.path=value (see --help)");
    cl.sets.push_back(b);
  }
  cl.index_given = vm.count("index") > 0;
  cl.help = vm.count("help") > 0;
  cl.reference = vm.count("config-reference") > 0;
  cl.dry_run = vm.count("dry-run") > 0;
  cl.list = vm.count("list") > 0;
  cl.resume = vm.count("resume") > 0;
  cl.summarize = vm.count("summarize") > 0;
  return cl;
}

// The experiment: its YAML and the config the command line makes of it (the points' values come on top).
struct Experiment {
  std::string text;
  Config base;
  Sweep sw;
};

Experiment read_experiment(const CommandLine& cl) {
  if (cl.yaml.empty()) throw input_error("--yaml FILE is required");
  Experiment ex;
  ex.text = read_text_file(cl.yaml);
  ex.base = config_from_yaml(ex.text, cl.yaml);
  ex.sw = parse_sweep(ex.text, cl.yaml);
  std::vector<Override> overrides;
  auto add = [&](const std::string& text, const std::string& what) {
    const Override ov = parse_override(text);
    if (std::find(ex.sw.keys.begin(), ex.sw.keys.end(), ov.key) != ex.sw.keys.end())
      throw input_error(what + ": the sweep varies " + ov.key + ", so its values would win over this one; change " +
                        ov.key + "'s list in the sweep: section (or take the key out of it) instead");
    overrides.push_back(ov);
  };
  for (const std::string& s : cl.sets) add(s, "override '" + s + "'");
  // --resume is checkpoint.resume: auto for this invocation, so the config printed and stored says so
  if (cl.resume) add("checkpoint.resume=auto", "--resume (checkpoint.resume: auto)");
  apply_overrides(ex.base, overrides, "the command line");  // together: a preset there replaces the file's dims
  return ex;
}

// The points to run: all of them, or --index I.
std::vector<int> chosen_points(const Sweep& sw, const CommandLine& cl) {
  if (cl.index >= int(sw.points.size()) || (cl.index_given && cl.index < 0))
    throw input_error("--index " + std::to_string(cl.index) + " is out of range: the sweep has " +
                      std::to_string(sw.points.size()) + " point(s) (see --list)");
  if (cl.index >= 0) return {cl.index};
  std::vector<int> all;
  for (auto& p : sw.points) all.push_back(p.index);
  return all;
}

// Every point to run validated and the files it reads checked, as a dry run does, so that bad input is
// an error before the first point writes anything.
void check_points(const Experiment& ex, const std::vector<int>& indices, HostComm& host) {
  InputsChecked seen;
  for (int i : indices) {
    Config c = point_config(ex.base, ex.sw, ex.sw.points[i]);
    try {
      const Plan plan = plan_with_fit(c, host.world());  // the inputs as the run will read them
      check_inputs(c, plan, seen);
    } catch (const Error& e) {
      if (!ex.sw.is_sweep) throw;
      throw Error(e.code(), "sweep point " + std::to_string(i) + " (" + c.run.name + "): " + e.what());
    }
  }
}

// The command line and the experiment are read and checked on every rank before any work. An error there
// is every rank's (the same command line, the same files), so the ranks agree on the outcome and end
// together, each with its exit status, no MPI_Abort: rank 0 names the error once, its own or (when only
// other ranks failed: files that differ between nodes) another rank's.
template <class Fn>
void before_work(HostComm& host, Fn&& fn) {
  agreed(host, "reading the experiment", std::forward<Fn>(fn));
}

}  // namespace

po::variables_map parse_options(int argc, char** argv, const po::options_description& opts) {
  po::options_description all = opts;
  all.add_options()("stray", po::value<std::vector<std::string>>()->composing());
  po::positional_options_description pos;
  pos.add("stray", -1);
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
  if (vm.count("stray"))
    throw input_error("unexpected argument '" + vm["stray"].as<std::vector<std::string>>().front() + "' (see --help)");
  return vm;
}

int run_app(int argc, char** argv, std::unique_ptr<HostComm>& host) {
  if (argc > 1 && std::string(argv[1]) == "sample") {
    host = make_host_comm(&argc, &argv);
    return run_sample(argc, argv, *host);
  }
  if (argc > 1 && std::string(argv[1]) == "export") return run_export(argc, argv);

  CommandLine cl;
  before_work(*host, [&] { cl = parse_command_line(argc, argv); });
  if (cl.help || argc == 1) {
    CommandLine unused;
    if (host->rank() == 0) std::cout << kUsage << "\n" << train_options(unused);
    return argc == 1 ? kExitBadInput : kExitOk;
  }
  if (cl.reference) {
    if (host->rank() == 0) std::cout << config_reference();
    return kExitOk;
  }
  // Only training starts MPI: the rest reads and prints, each process alone (under a launcher every
  // rank computes the same, rank 0 prints), and a dry run plans for the launcher's world size.
  const bool trains = !cl.list && !cl.summarize && !cl.dry_run;
  if (trains) host = make_host_comm(&argc, &argv);
  HostComm& h = *host;
  Experiment ex;
  std::vector<int> indices;
  before_work(h, [&] {
    ex = read_experiment(cl);
    if (cl.list) return;
    indices = chosen_points(ex.sw, cl);
    if (cl.summarize) {
      if (!ex.sw.is_sweep) throw input_error("--summarize: " + cl.yaml + " has no sweep: section");
      if (h.rank() == 0) write_summary(ex.base, ex.sw, ex.text);
    } else if (cl.dry_run) {
      dry_run(ex.base, ex.sw, indices, h);
    } else {
      check_points(ex, indices, h);
    }
  });
  if (cl.list) {
    if (h.rank() == 0) print_points(ex.base, ex.sw);
    return kExitOk;
  }
  if (!trains) return kExitOk;
  const std::vector<PlannedPoint> points = plan_points(ex.base, ex.sw, indices, h, cl.resume);
  return run_sweep(ex.base, ex.sw, points, h, cl.resume, ex.text);
}

}  // namespace gpt
