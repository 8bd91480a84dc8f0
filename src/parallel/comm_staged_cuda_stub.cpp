// Linked instead of comm_staged_cuda.cu when the binary is built without CUDA (make CUDA=0).
#include "parallel/comm_staged.hpp"

namespace gpt {
std::unique_ptr<DeviceStaging> make_cuda_staging(Backend&) {
  throw input_error("this binary was built without CUDA");
}
std::string cuda_pci_bus_id(int) { return ""; }
}  // namespace gpt
