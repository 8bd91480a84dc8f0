// The compute stack of a process: backend, communicator, parameter layout and ZeRO engine, built in one
// place for training and for sampling. Members are destroyed in reverse order (the engine before the
// communicator and the backend that own its memory).
#pragma once
#include <memory>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"
#include "parallel/zero.hpp"
#include "model/params.hpp"
#include "run/plan.hpp"

namespace gpt {

struct Stack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<ParamLayout> layout;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<ZeroEngine> engine;  // parameters, gradients and optimizer state, allocated
};

Stack build_stack(const Plan& plan, HostComm& host);

}  // namespace gpt
