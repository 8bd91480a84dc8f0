// `train sample`: token ids generated from a checkpoint, on one process.
#include <boost/program_options.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "cli/app.hpp"
#include "config/config_io.hpp"
#include "io/checkpoint.hpp"
#include "model/gpt.hpp"
#include "run/generate.hpp"
#include "run/stack.hpp"

namespace po = boost::program_options;

namespace gpt {

Config checkpoint_config(const std::string& ckpt) {
  Config c = config_from_yaml(read_checkpoint_config(ckpt), ckpt);
  c.training.zero_stage = 0;
  c.training.master_weights = false;
  return c;
}

namespace {

std::vector<int> parse_ids(const std::string& text, int vocab_size) {
  std::vector<int> ids;
  std::stringstream ss(text);
  for (std::string tok; std::getline(ss, tok, ',');) {
    int id = -1;
    try {
      id = std::stoi(tok);
    } catch (const std::exception&) {
    }
    if (id < 0 || id >= vocab_size) throw input_error("--prompt-ids: " + tok + " is not a token id");
    ids.push_back(id);
  }
  if (ids.empty()) throw input_error("--prompt-ids: give at least one token id");
  return ids;
}

}  // namespace

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
    std::cout << opts << "Prints the prompt and generated token ids, space-separated; scripts/sample.py turns text "
                         "into ids and back.\n";
    return 0;
  }
  po::notify(vm);
  if (host.world() != 1) throw input_error("sample runs on one process");
  Config cfg = checkpoint_config(ckpt);
  cfg.training.device = device;
  const Plan plan = make_plan(cfg, 1);
  std::vector<int> ids = parse_ids(prompt, plan.dims.vocab_size);
  Stack stack = build_stack(plan, host);
  const ParamLayout& layout = *stack.layout;
  const std::vector<float> params = read_checkpoint_params(ckpt, layout);
  for (int b = 0; b < layout.n_buckets(); ++b) stack.engine->set_bucket_params(b, params.data() + layout.logical_offset(b));
  const int T = std::min<int>(plan.dims.max_seq_len, int(ids.size()) + tokens);
  GPT model(plan.dims, layout, *stack.backend, 1, T, 0);
  ids = generate(model, *stack.engine, ids, tokens, temperature, seed);
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

}  // namespace gpt
