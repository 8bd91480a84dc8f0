// The command line: parses arguments and dispatches to train / sweep / sample / export.
#pragma once
#include <boost/program_options.hpp>

#include <string>

#include "config/config.hpp"
#include "dist/comm.hpp"

namespace gpt {
int run_app(int argc, char** argv, HostComm& host);

// Parses a subcommand's options (argv[0] is its name); a bare word is an input error naming it.
boost::program_options::variables_map parse_options(int argc, char** argv,
                                                    const boost::program_options::options_description& opts);

// The subcommands (cli/sample.cpp, cli/export.cpp); argv[1] is the subcommand's name.
int run_sample(int argc, char** argv, HostComm& host);
int run_export(int argc, char** argv);
// A checkpoint's model as a one-process config (no sharding, no master copy), for sampling and export.
Config checkpoint_config(const std::string& ckpt_dir);
}  // namespace gpt
