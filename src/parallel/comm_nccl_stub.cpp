// Linked instead of comm_nccl.cu when the binary is built without CUDA (make CUDA=0).
#include "parallel/comm.hpp"

namespace gpt {
std::unique_ptr<Communicator> make_nccl_communicator(HostComm&, Backend&) {
  throw input_error("this binary was built without CUDA/NCCL");
}
}  // namespace gpt
