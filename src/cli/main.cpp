// train: GPT-2 training on CPUs or GPUs, one run or a sweep described in YAML.
//   ./train --yaml experiments/quickstart.yaml          (see --help and docs/FORMATS.md)
//   ./train sample --ckpt DIR --prompt-ids 1,2,3 --tokens 64
//   ./train export --ckpt DIR --out model.bin [--dtype bf16]
#include <boost/program_options.hpp>

#include <iostream>
#include <string>

#include "cli/app.hpp"
#include "parallel/agree.hpp"
#include "parallel/comm.hpp"
#include "base/common.hpp"
#include "io/h5util.hpp"
#include "run/signals.hpp"

namespace po = boost::program_options;

namespace {
// "error: WHAT", a configuration error's own "config error: " said once ("error: config: ...")
std::string error_line(const std::string& what) {
  const std::string prefix = "config error: ";
  return "error: " + (what.rfind(prefix, 0) == 0 ? "config: " + what.substr(prefix.size()) : what);
}
}  // namespace

int main(int argc, char** argv) {
  gpt::install_stop_signals();
  gpt::h5::init_library();
  std::unique_ptr<gpt::HostComm> host = gpt::make_solo_host_comm();  // run_app starts MPI where needed
  int code = 0;
  try {
    code = gpt::run_app(argc, argv, host);
  } catch (const po::error& e) {
    if (host->rank() == 0) std::cerr << "error: " << e.what() << " (see --help)\n";
    code = gpt::kExitBadInput;
  } catch (const gpt::AgreedError& e) {
    // every rank has it and ends here (bad input found before any work): said once, no MPI_Abort
    if (host->rank() == 0) std::cerr << error_line(e.what()) << "\n";
    code = e.code();
  } catch (const gpt::Error& e) {
    std::cerr << (host->world() > 1 ? "[rank " + std::to_string(host->rank()) + "] " : std::string())
              << error_line(e.what()) << "\n";
    code = e.code();
    if (host->world() > 1) host->abort(code);  // never leave the other ranks waiting
  } catch (const std::exception& e) {
    std::cerr << "[rank " << host->rank() << "] internal error: " << e.what() << "\n";
    code = gpt::kExitFailure;
    if (host->world() > 1) host->abort(code);
  }
  host.reset();
  return code;
}
