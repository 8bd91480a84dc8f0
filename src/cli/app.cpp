#include "cli/app.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <iostream>

#include "config/config_io.hpp"
#include "run/dry_run.hpp"
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
    "  train export --ckpt DIR --out PATH [--format llmc|hf] [--dtype fp32|bf16]\n"
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

// The points to run: all of them, or --index I.
std::vector<int> chosen_points(const Sweep& sw, const po::variables_map& vm, int index) {
  if (index >= int(sw.points.size()) || (vm.count("index") && index < 0))
    throw input_error("--index " + std::to_string(index) + " is out of range: the sweep has " +
                      std::to_string(sw.points.size()) + " point(s) (see --list)");
  if (index >= 0) return {index};
  std::vector<int> all;
  for (auto& p : sw.points) all.push_back(p.index);
  return all;
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

int run_app(int argc, char** argv, HostComm& host) {
  if (argc > 1 && std::string(argv[1]) == "sample") return run_sample(argc, argv, host);
  if (argc > 1 && std::string(argv[1]) == "export") return run_export(argc, argv);

  po::options_description opts("train");
  std::string yaml;
  std::vector<std::string> sets;
  int index = -1;
  opts.add_options()("help,h", "this help")("yaml", po::value(&yaml), "experiment YAML (a run or a sweep)")(
      "set", po::value(&sets)->composing(), "override one key: key.path=value (repeatable)")(
      "dry-run", "validate, print the resolved config and predicted memory, and exit")(
      "list", "print the sweep's points and exit")("index", po::value(&index), "run only sweep point I")(
      "resume", "continue from the latest valid checkpoint")(
      "summarize", "rewrite the sweep summary from the points' logs and exit")(
      "config-reference", "print every config key with its type, default and meaning (docs/CONFIG.md) and exit");
  // A bare `key.path=value` (the Hydra habit) is an override like --set; any other bare word is an error,
  // never silently dropped.
  std::vector<std::string> bare;
  po::options_description all = opts;
  all.add_options()("override", po::value(&bare)->composing());
  po::positional_options_description pos;
  pos.add("override", -1);
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
  po::notify(vm);
  for (const std::string& b : bare) {
    if (b.find('=') == std::string::npos || b.find('=') == 0)
      throw input_error("unexpected argument '" + b + "': give the experiment with --yaml FILE and overrides as "
                        "key.path=value or --set key.path=value (see --help)");
    sets.push_back(b);
  }
  if (vm.count("help") || argc == 1) {
    if (host.rank() == 0) std::cout << kUsage << "\n" << opts;
    return argc == 1 ? kExitBadInput : kExitOk;
  }
  if (vm.count("config-reference")) {
    if (host.rank() == 0) std::cout << config_reference();
    return kExitOk;
  }
  if (yaml.empty()) throw input_error("--yaml FILE is required");
  const std::string text = read_text_file(yaml);
  Config base = config_from_yaml(text, yaml);
  const Sweep sw = parse_sweep(text, yaml);
  for (auto& s : sets) {
    const Override ov = parse_override(s);
    if (std::find(sw.keys.begin(), sw.keys.end(), ov.key) != sw.keys.end())
      throw input_error("override '" + s + "': the sweep varies " + ov.key +
                        ", so its values would win over this one; change " + ov.key +
                        "'s list in the sweep: section (or take the key out of it) instead");
    apply_override(base, ov);
  }

  if (vm.count("list")) {
    if (host.rank() == 0) print_points(base, sw);
    return kExitOk;
  }
  const std::vector<int> indices = chosen_points(sw, vm, index);
  if (vm.count("summarize")) {
    if (!sw.is_sweep) throw input_error("--summarize: " + yaml + " has no sweep: section");
    if (host.rank() == 0) write_summary(base, sw, text);
    return kExitOk;
  }
  const bool resume = vm.count("resume") > 0;
  if (vm.count("dry-run")) {
    dry_run(base, sw, indices, host);
    return kExitOk;
  }
  const std::vector<PlannedPoint> points = plan_points(base, sw, indices, host, resume);  // before any work
  return run_sweep(base, sw, points, host, resume, text);
}

}  // namespace gpt
