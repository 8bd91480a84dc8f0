// The command line: parses arguments and dispatches to train / sweep / sample / export.
#pragma once
#include "dist/comm.hpp"

namespace gpt {
int run_app(int argc, char** argv, HostComm& host);
}
