#include "run/stack.hpp"

#include <algorithm>

namespace gpt {

Stack build_stack(const Plan& plan, HostComm& host) {
  Stack s;
  BackendOptions o = plan.backend;
  o.local_rank = host.local_rank();
  const bool cuda = plan.device == "cuda";
  // ranks sharing GPUs take them in turn (parallel/placement.hpp); otherwise one GPU per local rank
  if (cuda && plan.shared_gpu) o.local_rank = std::max(0, gpu_of_local_rank(o.local_rank, cuda_device_count(), true));
  s.backend = cuda ? make_cuda_backend(o) : make_cpu_backend(o);
  // the model's ops this backend cannot run, named before any work
  NormFwd norm;
  norm.kind = plan.model.dims.norm;
  if (const std::string why = s.backend->supports(norm); !why.empty()) throw input_error("model.norm: " + why);
  if (plan.shared_gpu)
    s.comm = make_staged_communicator(host, *s.backend);
  else
    s.comm = cuda ? make_nccl_communicator(host, *s.backend) : make_mpi_communicator(host);
  s.layout = std::make_unique<ParamLayout>(plan.model.dims);
  s.optimizer = make_optimizer(plan.optimizer, plan.stochastic_rounding, plan.zero.state, plan.hypers);
  s.engine = std::make_unique<ZeroEngine>(*s.layout, *s.backend, *s.comm, host, plan.zero, plan.master_weights,
                                          *s.optimizer);
  return s;
}

}  // namespace gpt
