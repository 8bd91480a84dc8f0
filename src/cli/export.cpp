// `train export`: a checkpoint's weights as an llm.c model file.
#include <boost/program_options.hpp>

#include <iostream>

#include "cli/app.hpp"
#include "io/checkpoint.hpp"
#include "io/modelfile.hpp"

namespace po = boost::program_options;

namespace gpt {

int run_export(int argc, char** argv) {
  po::options_description opts("train export");
  std::string ckpt, out, dtype = "fp32";
  opts.add_options()("help,h", "this help")("ckpt", po::value(&ckpt)->required(), "checkpoint folder")(
      "out", po::value(&out)->required(), "llm.c model file to write")("dtype", po::value(&dtype), "fp32 | bf16");
  po::variables_map vm = parse_options(argc - 1, argv + 1, opts);
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

}  // namespace gpt
