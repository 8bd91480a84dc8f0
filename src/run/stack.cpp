#include "run/stack.hpp"

namespace gpt {

Stack build_stack(const Plan& plan, HostComm& host) {
  Stack s;
  BackendOptions o = plan.backend;
  o.local_rank = host.local_rank();
  const bool cuda = plan.device == "cuda";
  s.backend = cuda ? make_cuda_backend(o) : make_cpu_backend(o);
  s.comm = cuda ? make_nccl_communicator(host, *s.backend) : make_mpi_communicator(host);
  s.layout = std::make_unique<ParamLayout>(plan.dims);
  s.optimizer = make_optimizer(plan.optimizer, plan.stochastic_rounding, plan.zero.state);
  s.engine = std::make_unique<ZeroEngine>(*s.layout, *s.backend, *s.comm, host, plan.zero, plan.master_weights,
                                          *s.optimizer);
  return s;
}

}  // namespace gpt
