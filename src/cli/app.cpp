#include "cli/app.hpp"

#include <boost/program_options.hpp>

#include <cmath>
#include <iostream>
#include <random>
#include <sstream>

#include "backend/backend.hpp"
#include "io/checkpoint.hpp"
#include "config/config_io.hpp"
#include "io/modelfile.hpp"
#include "run/sweep.hpp"
#include "run/trainer.hpp"

namespace po = boost::program_options;

namespace gpt {
namespace {

const char* kUsage =
    "usage:\n"
    "  train --yaml FILE [--set key.path=value]... [--dry-run] [--list] [--index I] [--resume] [--summarize]\n"
    "  train sample --ckpt DIR [--prompt-ids 50256,...] [--tokens N] [--temperature T] [--seed S]\n"
    "  train export --ckpt DIR --out FILE [--dtype fp32|bf16]\n"
    "Exit status: 0 ok, 1 bad input, 2 training failure, 3 out of memory, 75 checkpointed (resume me).\n"
    "Config keys and defaults: docs/CONFIG.md; file layouts: docs/FORMATS.md.\n";

// A checkpoint's model, built on one process for sampling and export.
Config checkpoint_config(const std::string& ckpt) {
  Config c = config_from_yaml(read_checkpoint_config(ckpt), ckpt);
  c.training.zero_stage = 0;
  return c;
}

int run_sample(int argc, char** argv, HostComm& host) {
  po::options_description opts("train sample");
  std::string ckpt, prompt = "50256", device = "cpu";
  int tokens = 64;
  double temperature = 1.0;
  uint64_t seed = 1;
  opts.add_options()("help,h", "this help")("ckpt", po::value(&ckpt)->required(), "checkpoint folder (step_NNNNNNNN)")(
      "prompt-ids", po::value(&prompt), "comma-separated token ids (default: <|endoftext|>)")(
      "tokens", po::value(&tokens), "tokens to generate")("temperature", po::value(&temperature), "0 = greedy")(
      "seed", po::value(&seed), "sampling seed")("device", po::value(&device), "cpu | cuda | auto");
  po::variables_map vm;
  po::store(po::parse_command_line(argc - 1, argv + 1, opts), vm);
  if (vm.count("help")) {
    std::cout << opts << "Prints the prompt and generated token ids, space-separated; scripts/sample.py turns text into ids and back.\n";
    return 0;
  }
  po::notify(vm);
  if (host.world() != 1) throw input_error("sample runs on one process");
  Config cfg = checkpoint_config(ckpt);
  cfg.training.device = device;
  Plan plan = make_plan(cfg, 1);
  ParamLayout layout(plan.dims);
  std::vector<float> params = read_checkpoint_params(ckpt, layout);
  std::vector<int> ids;
  std::stringstream ss(prompt);
  for (std::string tok; std::getline(ss, tok, ',');) {
    const int id = std::stoi(tok);
    if (id < 0 || id >= plan.dims.vocab_size) throw input_error("--prompt-ids: " + tok + " is not a token id");
    ids.push_back(id);
  }
  if (ids.empty()) throw input_error("--prompt-ids: give at least one token id");
  const int T = std::min<int>(plan.dims.max_seq_len, int(ids.size()) + tokens);
  auto be = plan.device == "cuda" ? make_cuda_backend(plan.backend) : make_cpu_backend(plan.backend);
  auto comm = plan.device == "cuda" ? make_nccl_communicator(host, *be) : make_mpi_communicator(host);
  ZeroEngine engine(layout, *be, *comm, host, 0, false);
  for (int b = 0; b < layout.n_buckets(); ++b) engine.set_bucket_params(b, params.data() + layout.logical_offset(b));
  GPT model(plan.dims, layout, *be, 1, T, 0);
  std::mt19937_64 rng(seed);
  std::vector<float> logits(plan.dims.vocab_size);
  std::vector<int> window(T, 0);
  for (int i = 0; i < tokens; ++i) {
    // the last T tokens (positions beyond the end are padding the causal mask ignores)
    const int start = std::max(0, int(ids.size()) - T), n = int(ids.size()) - start;
    std::fill(window.begin(), window.end(), 0);
    std::copy(ids.begin() + start, ids.end(), window.begin());
    model.logits_row(engine, window.data(), n - 1, logits.data());
    int next = 0;
    if (temperature <= 0) {
      next = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      const float mx = *std::max_element(logits.begin(), logits.end());
      std::vector<double> p(logits.size());
      for (size_t j = 0; j < p.size(); ++j) p[j] = std::exp((logits[j] - mx) / temperature);
      next = std::discrete_distribution<int>(p.begin(), p.end())(rng);
    }
    ids.push_back(next);
  }
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

int run_export(int argc, char** argv) {
  po::options_description opts("train export");
  std::string ckpt, out, dtype = "fp32";
  opts.add_options()("help,h", "this help")("ckpt", po::value(&ckpt)->required(), "checkpoint folder")(
      "out", po::value(&out)->required(), "llm.c model file to write")("dtype", po::value(&dtype), "fp32 | bf16");
  po::variables_map vm;
  po::store(po::parse_command_line(argc - 1, argv + 1, opts), vm);
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  po::notify(vm);
  if (dtype != "fp32" && dtype != "bf16") throw input_error("--dtype: '" + dtype + "' is not fp32 or bf16");
  Config cfg = checkpoint_config(ckpt);
  ParamLayout layout(resolve_dims(cfg.model));
  write_model_file(out, layout, read_checkpoint_params(ckpt, layout), dtype == "bf16");
  std::cout << "wrote " << out << " (" << dtype << ", " << layout.n_params() << " parameters)\n";
  return 0;
}

}  // namespace

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
      "summarize", "rewrite the sweep summary from the points' logs and exit");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help") || argc == 1) {
    if (host.rank() == 0) std::cout << kUsage << "\n" << opts;
    return argc == 1 ? kExitBadInput : kExitOk;
  }
  if (yaml.empty()) throw input_error("--yaml FILE is required");
  const std::string text = read_text_file(yaml);
  Config base = config_from_yaml(text, yaml);
  for (auto& s : sets) apply_override(base, parse_override(s));
  Sweep sw = parse_sweep(text, yaml);

  if (vm.count("list")) {
    if (host.rank() == 0)
      for (auto& p : sw.points) {
        std::cout << p.index << "\t" << (sw.is_sweep ? p.dir_name : base.run.name) << "\t";
        for (size_t i = 0; i < p.values.size(); ++i) std::cout << (i ? " " : "") << p.values[i].key << "=" << p.values[i].value;
        std::cout << "\n";
      }
    return kExitOk;
  }
  if (index >= int(sw.points.size()) || (vm.count("index") && index < 0))
    throw input_error("--index " + std::to_string(index) + " is out of range: the sweep has " +
                      std::to_string(sw.points.size()) + " point(s) (see --list)");
  std::vector<int> indices;
  if (index >= 0) indices.push_back(index);
  else
    for (auto& p : sw.points) indices.push_back(p.index);

  if (vm.count("summarize")) {
    if (!sw.is_sweep) throw input_error("--summarize: " + yaml + " has no sweep: section");
    if (host.rank() == 0) write_summary(base, sw, text);
    return kExitOk;
  }
  if (vm.count("dry-run")) {
    // validate every point before saying yes
    for (int i : indices) {
      Config c = point_config(base, sw, sw.points[i]);
      Plan plan = make_plan(c, host.world());
      if (host.rank() == 0) {
        if (sw.is_sweep) std::cout << "=== sweep point " << i << " (" << c.run.name << ")\n";
        print_plan(c, plan, predict_memory(c, plan));
      }
    }
    return kExitOk;
  }
  if (!sw.is_sweep) validate(base, host.world());  // a bad single run fails before anything is written
  return run_sweep(base, sw, indices, host, vm.count("resume") > 0, text);
}

}  // namespace gpt
