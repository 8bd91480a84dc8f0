// `train export`: a checkpoint's weights as an llm.c model file or a Hugging Face GPT-2 folder.
#include <boost/program_options.hpp>

#include <iostream>
#include <memory>

#include "cli/app.hpp"
#include "io/checkpoint.hpp"
#include "io/hf.hpp"
#include "io/modelfile.hpp"
#include "io/run_dir.hpp"

namespace po = boost::program_options;

namespace gpt {

int run_export(int argc, char** argv) {
  po::options_description opts("train export");
  std::string ckpt, out, dtype = "fp32", format = "llmc", vocab, merges;
  opts.add_options()("help,h", "this help")(
      "ckpt", po::value(&ckpt)->required(),
      "a run directory, its checkpoints/ folder or checkpoints/latest (the newest checkpoint), or a step folder")(
      "out", po::value(&out)->required(), "llmc: the model file to write; hf: the folder to write")(
      "format", po::value(&format), "llmc (llm.c model file, default) | hf (Hugging Face GPT-2: config.json, "
                                    "model.safetensors, generation_config.json, and the tokenizer files for a "
                                    "model on GPT-2's BPE)")("dtype", po::value(&dtype), "fp32 | bf16")(
      "vocab", po::value(&vocab), "hf: a folder with GPT-2's vocab.json and merges.txt for the tokenizer files, "
                                  "or with --merges the vocab.json file (default: the run's eval.vocab)")(
      "merges", po::value(&merges), "hf: GPT-2's merges.txt file, beside --vocab naming vocab.json")(
      "force", "replace --out when it exists (never a run's own files: its .lock, logs, CSV files or anything in "
               "its checkpoints/)");
  po::variables_map vm = parse_options(argc - 1, argv + 1, opts);
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  po::notify(vm);
  if (dtype != "fp32" && dtype != "bf16") throw input_error("--dtype: '" + dtype + "' is not fp32 or bf16");
  if (format != "llmc" && format != "hf") throw input_error("--format: '" + format + "' is not llmc or hf");
  if (!vocab.empty() && format != "hf") throw input_error("--vocab: only --format hf writes a tokenizer");
  if (!merges.empty() && format != "hf") throw input_error("--merges: only --format hf writes a tokenizer");
  const bool force = vm.count("force") > 0;
  check_output_path(out, "--out", "export", force, "", format == "hf");
  std::string dir;
  Config cfg;
  std::unique_ptr<ParamLayout> layout;
  HfTokenizerSource tokenizer;
  std::vector<float> params;
  read_resolved_checkpoint(ckpt, [&](const std::string& d) {
    dir = d;
    check_output_path(out, "--out", "export", force, dir, format == "hf");
    cfg = checkpoint_config(dir);
    layout = std::make_unique<ParamLayout>(resolve_dims(cfg.model));
    if (const std::string other = non_gpt2_structure(cfg.model, format == "hf"); !other.empty())
      throw input_error("export: the checkpoint's model has " + other + "; " +
                        (format == "hf" ? "Hugging Face GPT-2 folders hold GPT-2's structure, or with an untied head"
                                        : "llm.c model files hold GPT-2's structure only (--format hf also holds an "
                                          "untied head)") +
                        ". The checkpoint itself is what this model is kept in");
    // the tokenizer is checked before anything is written: a bad --vocab leaves no half-written folder
    if (format == "hf")
      tokenizer = hf_tokenizer_source(layout->dims(), vocab, merges, cfg.eval.vocab, cfg.eval.merges);
    params = read_checkpoint_params(dir, *layout);
  });
  if (format == "hf") {
    write_hf_model(out, *layout, params, dtype == "bf16");
    if (!tokenizer.vocab_json.empty()) write_hf_tokenizer(out, layout->dims(), tokenizer);
    else remove_hf_tokenizer(out);  // replacing an earlier export (--force): its tokenizer is not this model's
  } else {
    write_model_file(out, *layout, params, dtype == "bf16");
  }
  std::cout << "wrote " << out << (format == "hf" ? "/ (Hugging Face GPT-2, " : " (llm.c, ") << dtype << ", "
            << layout->n_params() << " parameters) from " << dir << "\n";
  if (format == "hf")
    std::cout << (tokenizer.vocab_json.empty() ? tokenizer.note
                                               : "tokenizer: GPT-2's BPE from " + tokenizer.from +
                                                     " (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json)")
              << "\n";
  return 0;
}

}  // namespace gpt
