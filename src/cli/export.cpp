// `train export`: a checkpoint's weights as an llm.c model file or a Hugging Face GPT-2 folder.
#include <boost/program_options.hpp>

#include <filesystem>
#include <iostream>

#include "cli/app.hpp"
#include "io/checkpoint.hpp"
#include "io/hf.hpp"
#include "io/modelfile.hpp"
#include "io/run_dir.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace gpt {

namespace {
// An export never writes over what it may not: a run's log.h5 (or a log it kept), anything inside a
// run's checkpoints/ folder or the checkpoint it reads, whatever --force says; and nothing that exists
// without --force. Input error naming --out otherwise.
void check_out(const std::string& out, const std::string& ckpt_dir, bool force) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(out, ec), ec);
  const fs::path from = fs::weakly_canonical(fs::absolute(ckpt_dir, ec), ec);
  const std::string name = p.filename().string();
  const auto never = [&](const std::string& why) {
    throw input_error("--out '" + out + "' " + why + ": export never writes there (not even with --force); "
                      "give another path");
  };
  if (holds_run(p.parent_path().string()) && name.size() >= 6 && name.rfind("log.", 0) == 0 &&
      name.compare(name.size() - 3, 3, ".h5") == 0)
    never("is a run's log");
  for (fs::path a = p; a.has_relative_path(); a = a.parent_path()) {
    if (a == from) never("lies inside the checkpoint it exports (" + ckpt_dir + ")");
    if (a != p && a.filename() == "checkpoints" && fs::is_directory(a, ec) &&
        (fs::exists(a / "latest", ec) || fs::exists(a.parent_path() / "log.h5", ec) ||
         !list_checkpoints(a.parent_path().string()).empty()))
      never("lies inside a run's checkpoints folder '" + a.string() + "'");
    if (a == a.parent_path()) break;
  }
  if (fs::exists(fs::symlink_status(out, ec)) && !force)
    throw input_error("--out '" + out + "' exists: give --force to replace " +
                      (fs::is_directory(out, ec) ? "the files an export writes in it" : std::string("it")) +
                      ", or another path");
}
}  // namespace

int run_export(int argc, char** argv) {
  po::options_description opts("train export");
  std::string ckpt, out, dtype = "fp32", format = "llmc", vocab;
  opts.add_options()("help,h", "this help")(
      "ckpt", po::value(&ckpt)->required(),
      "a run directory, its checkpoints/ folder or checkpoints/latest (the newest checkpoint), or a step folder")(
      "out", po::value(&out)->required(), "llmc: the model file to write; hf: the folder to write")(
      "format", po::value(&format), "llmc (llm.c model file, default) | hf (Hugging Face GPT-2: config.json, "
                                    "model.safetensors, generation_config.json, and the tokenizer files for a "
                                    "model on GPT-2's BPE)")("dtype", po::value(&dtype), "fp32 | bf16")(
      "vocab", po::value(&vocab), "hf: a folder with GPT-2's vocab.json and merges.txt for the tokenizer files "
                                  "(default: the run's eval.vocab)")(
      "force", "replace --out when it exists (never a run's log.h5 or anything in its checkpoints/)");
  po::variables_map vm = parse_options(argc - 1, argv + 1, opts);
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  po::notify(vm);
  if (dtype != "fp32" && dtype != "bf16") throw input_error("--dtype: '" + dtype + "' is not fp32 or bf16");
  if (format != "llmc" && format != "hf") throw input_error("--format: '" + format + "' is not llmc or hf");
  if (!vocab.empty() && format != "hf") throw input_error("--vocab: only --format hf writes a tokenizer");
  const std::string dir = resolve_checkpoint(ckpt);
  check_out(out, dir, vm.count("force") > 0);
  Config cfg = checkpoint_config(dir);
  ParamLayout layout(resolve_dims(cfg.model));
  // the tokenizer is checked before anything is written: a bad --vocab leaves no half-written folder
  const HfTokenizerSource tokenizer =
      format == "hf" ? hf_tokenizer_source(layout.dims(), vocab, cfg.eval.vocab) : HfTokenizerSource{};
  const std::vector<float> params = read_checkpoint_params(dir, layout);
  if (format == "hf") {
    write_hf_model(out, layout, params, dtype == "bf16");
    if (!tokenizer.dir.empty()) {
      write_hf_tokenizer(out, layout.dims(), tokenizer);
    } else {  // replacing an earlier export (--force): its tokenizer would not be this model's
      std::error_code ec;
      for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"})
        fs::remove(fs::path(out) / f, ec);
    }
  } else {
    write_model_file(out, layout, params, dtype == "bf16");
  }
  std::cout << "wrote " << out << (format == "hf" ? "/ (Hugging Face GPT-2, " : " (llm.c, ") << dtype << ", "
            << layout.n_params() << " parameters) from " << dir << "\n";
  if (format == "hf")
    std::cout << (tokenizer.dir.empty() ? tokenizer.note
                                        : "tokenizer: GPT-2's BPE from " + tokenizer.dir +
                                              " (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json)")
              << "\n";
  return 0;
}

}  // namespace gpt
