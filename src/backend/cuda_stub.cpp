// Linked instead of src/cuda/ when the binary is built without CUDA (make CUDA=0).
#include "backend/backend.hpp"
#include "dist/comm.hpp"

namespace gpt {
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw input_error("training.device: this binary was built without CUDA (make CUDA=0); use device: cpu");
}
int cuda_device_count() { return 0; }
size_t cuda_device_memory() { return 0; }
std::unique_ptr<Communicator> make_nccl_communicator(HostComm&, Backend&) {
  throw input_error("this binary was built without CUDA/NCCL");
}
}  // namespace gpt
