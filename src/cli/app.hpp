// The command line: parses arguments and dispatches to train / sweep / sample / export.
#pragma once
#include <boost/program_options.hpp>

#include <memory>
#include <string>

#include "config/config.hpp"
#include "parallel/comm.hpp"

namespace gpt {
// `host` comes without MPI (make_solo_host_comm); the commands that train or sample replace it with MPI's
// world (make_host_comm) once the command line is read, the others never start MPI.
int run_app(int argc, char** argv, std::unique_ptr<HostComm>& host);

// Parses a subcommand's options (argv[0] is its name); a bare word is an input error naming it.
boost::program_options::variables_map parse_options(int argc, char** argv,
                                                    const boost::program_options::options_description& opts);

// The subcommands (cli/sample.cpp, cli/export.cpp); argv[1] is the subcommand's name.
int run_sample(int argc, char** argv, HostComm& host);
int run_export(int argc, char** argv);
// A checkpoint's model as a one-process config (no sharding, no master copy), for sampling and export.
Config checkpoint_config(const std::string& ckpt_dir);
}  // namespace gpt
