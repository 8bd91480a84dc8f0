// `train sample`: token ids generated from a checkpoint, on one process.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/app.hpp"
#include "config/config_io.hpp"
#include "io/checkpoint.hpp"
#include "io/h5util.hpp"
#include "io/run_dir.hpp"
#include "model/gpt.hpp"
#include "run/generate.hpp"
#include "run/stack.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace gpt {

Config checkpoint_config(const std::string& ckpt) {
  Config c = config_from_yaml(read_checkpoint_config(ckpt), ckpt);
  c.training.zero_stage = 0;
  c.training.master_weights = MasterWeights::none;
  return c;
}

namespace {

// between the prompt's ids and the generated ones in what `train sample` prints
constexpr const char* kPromptEnd = "|";

std::vector<int> parse_ids(const std::string& text, int vocab_size) {
  std::vector<int> ids;
  std::stringstream ss(text);
  for (std::string tok; std::getline(ss, tok, ',');) {
    long long id = -1;
    size_t used = 0;
    try {
      id = std::stoll(tok, &used);
    } catch (const std::exception&) {
    }
    if (used == 0 || tok.find_first_not_of(" \t", used) != std::string::npos || id < 0 || id >= vocab_size)
      throw input_error("--prompt-ids: '" + tok + "' is not a token id of this model (0 to " +
                        std::to_string(vocab_size - 1) + ")");
    ids.push_back(int(id));
  }
  if (ids.empty()) throw input_error("--prompt-ids: give at least one token id");
  return ids;
}

// logits (n, V) of the prompt's n positions into an HDF5 file (dataset /logits, float32), for comparing
// this trainer's forward with another implementation's (scripts/check_hf_export.py). Written as path.tmp
// and renamed over path: a failed write leaves whatever was at path as it was.
void write_logits(const std::string& path, const std::vector<float>& logits, size_t n, size_t V, bool force) {
  h5::silence_errors();
  const std::string tmp = path + ".tmp";
  try {
    {
      h5::Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
      if (!f.valid()) throw input_error("--logits: cannot create '" + tmp + "'" + full_disk_note(tmp));
      const hsize_t dims[2] = {n, V};
      h5::Id space(H5_CHECK(H5Screate_simple(2, dims, nullptr)));
      h5::Id ds(H5_CHECK(H5Dcreate2(f, "logits", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
      H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, logits.data()));
      h5::set_attr(ds, "units", std::string("nats (unnormalised log-probabilities)"));
      if (H5Fflush(f, H5F_SCOPE_LOCAL) < 0)
        throw input_error("--logits: writing '" + tmp + "' failed" + full_disk_note(tmp));
    }
    // made meanwhile (no --force): left as it is
    std::error_code ec;
    if (!force && fs::exists(fs::symlink_status(path, ec)))
      throw input_error("--logits '" + path + "' exists: give --force to replace it, or another path");
    fs::rename(tmp, path, ec);
    if (ec) throw input_error("--logits: cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace

int run_sample(int argc, char** argv, HostComm& host) {
  po::options_description opts("train sample");
  std::string ckpt, prompt, device = "cpu", logits_path;
  int tokens = 64;
  double temperature = 1.0;
  uint64_t seed = 1;
  opts.add_options()("help,h", "this help")(
      "ckpt", po::value(&ckpt)->required(),
      "a run directory, its checkpoints/ folder or checkpoints/latest (the newest checkpoint), or a step folder")(
      "prompt-ids", po::value(&prompt),
      "comma-separated token ids (default: the vocabulary's last id, GPT-2's <|endoftext|> 50256)")(
      "tokens", po::value(&tokens)->default_value(tokens), "tokens to generate")(
      "temperature", po::value(&temperature)->default_value(temperature), "0 = greedy")(
      "seed", po::value(&seed)->default_value(seed), "sampling seed")(
      "device", po::value(&device)->default_value(device), "cpu | cuda | auto")(
      "logits", po::value(&logits_path), "also write the prompt positions' logits to this HDF5 file (/logits); "
                                         "never a run's own files (docs/FORMATS.md)")(
      "force", "replace the --logits file when it exists")(
      "print-config", "print the config the checkpoint was trained with (YAML) and exit");
  po::variables_map vm = parse_options(argc - 1, argv + 1, opts);
  if (vm.count("help")) {
    std::cout << opts << "Prints the prompt's token ids, \"" << kPromptEnd << "\", then the generated ids, on one "
              << "line\n(\"50256 " << kPromptEnd << " 464 3290\"); scripts/sample.py turns text into ids and back.\n";
    return 0;
  }
  po::notify(vm);
  if (host.world() != 1) throw input_error("sample runs on one process");
  if (tokens < 0) throw input_error("--tokens: " + std::to_string(tokens) + " is negative (tokens to generate: 0 or more)");
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw input_error("--temperature: must be a finite number >= 0 (0 = greedy)");
  const bool force = vm.count("force") > 0;
  if (!logits_path.empty()) check_output_path(logits_path, "--logits", "sample", force, "", false);
  if (vm.count("print-config")) {
    std::string text;
    read_resolved_checkpoint(ckpt, [&](const std::string& dir) { text = read_checkpoint_config(dir); });
    std::cout << text;
    return 0;
  }
  Config cfg;
  std::unique_ptr<Plan> plan;
  std::vector<int> ids;
  std::vector<float> params;
  read_resolved_checkpoint(ckpt, [&](const std::string& dir) {
    if (!logits_path.empty()) check_output_path(logits_path, "--logits", "sample", force, dir, false);
    cfg = checkpoint_config(dir);
    apply_override(cfg, {"training.device", device});  // named as the config names it
    plan = std::make_unique<Plan>(make_plan(cfg, 1));
    // no prompt: the last id, which in GPT-2's vocabulary is <|endoftext|>, the start of a document
    ids = vm.count("prompt-ids") ? parse_ids(prompt, plan->model.dims.vocab_size)
                                 : std::vector<int>{plan->model.dims.vocab_size - 1};
    params = read_checkpoint_params(dir, ParamLayout(plan->model.dims));
  });
  Stack stack = build_stack(*plan, host);
  const ParamLayout& layout = *stack.layout;
  for (int b = 0; b < layout.n_buckets(); ++b) stack.engine->set_bucket_params(b, params.data() + layout.logical_offset(b));
  const int T = int(std::min<int64_t>(plan->model.dims.max_seq_len, int64_t(ids.size()) + tokens));
  GPT model(plan->model.dims, layout, *stack.backend, 1, T, 0);
  std::vector<int> window(T, 0);
  if (!logits_path.empty()) {
    const size_t n = std::min<size_t>(ids.size(), size_t(T)), V = size_t(plan->model.dims.vocab_size);
    std::vector<float> all(n * V);
    std::copy(ids.begin(), ids.begin() + n, window.begin());
    for (size_t pos = 0; pos < n; ++pos) model.logits_row(*stack.engine, window.data(), int(pos), all.data() + pos * V);
    write_logits(logits_path, all, n, V, force);
  }
  const size_t n_prompt = ids.size();
  ids = generate(model, *stack.engine, ids, tokens, temperature, seed);
  // "1 2 3 | 4 5 6": the prompt (never empty), the marker, what was generated
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == n_prompt) std::cout << " " << kPromptEnd;
    std::cout << (i ? " " : "") << ids[i];
  }
  if (ids.size() == n_prompt) std::cout << " " << kPromptEnd;
  std::cout << "\n";
  return 0;
}

}  // namespace gpt
