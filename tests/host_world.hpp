// The host world of a test program: MPI once per process (a world of 1 without a launcher, the ranks of
// mpirun with one), finalized at exit.
#pragma once
#include <memory>

#include "parallel/comm.hpp"

namespace gpt::tests {

inline HostComm& host_world() {
  static std::unique_ptr<HostComm> host = [] {
    int argc = 0;
    char** argv = nullptr;
    return make_host_comm(&argc, &argv);
  }();
  return *host;
}

}  // namespace gpt::tests
