// `train export`: a checkpoint's weights as an llm.c model file or a Hugging Face GPT-2 folder.
#include <boost/program_options.hpp>

#include <iostream>

#include "cli/app.hpp"
#include "io/checkpoint.hpp"
#include "io/hf.hpp"
#include "io/modelfile.hpp"

namespace po = boost::program_options;

namespace gpt {

int run_export(int argc, char** argv) {
  po::options_description opts("train export");
  std::string ckpt, out, dtype = "fp32", format = "llmc";
  opts.add_options()("help,h", "this help")(
      "ckpt", po::value(&ckpt)->required(),
      "a run directory, its checkpoints/ folder or checkpoints/latest (the newest checkpoint), or a step folder")(
      "out", po::value(&out)->required(), "llmc: the model file to write; hf: the folder to write")(
      "format", po::value(&format), "llmc (llm.c model file, default) | hf (Hugging Face GPT-2: config.json, "
                                    "model.safetensors)")("dtype", po::value(&dtype), "fp32 | bf16");
  po::variables_map vm = parse_options(argc - 1, argv + 1, opts);
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  po::notify(vm);
  if (dtype != "fp32" && dtype != "bf16") throw input_error("--dtype: '" + dtype + "' is not fp32 or bf16");
  if (format != "llmc" && format != "hf") throw input_error("--format: '" + format + "' is not llmc or hf");
  const std::string dir = resolve_checkpoint(ckpt);
  Config cfg = checkpoint_config(dir);
  ParamLayout layout(resolve_dims(cfg.model));
  const std::vector<float> params = read_checkpoint_params(dir, layout);
  if (format == "hf") write_hf_model(out, layout, params, dtype == "bf16");
  else write_model_file(out, layout, params, dtype == "bf16");
  std::cout << "wrote " << out << (format == "hf" ? "/ (Hugging Face GPT-2, " : " (llm.c, ") << dtype << ", "
            << layout.n_params() << " parameters) from " << dir << "\n";
  return 0;
}

}  // namespace gpt
