// Linked instead of src/backend/cuda/ when the binary is built without CUDA (make CUDA=0).
#include "backend/backend.hpp"

namespace gpt {
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw input_error("training.device: this binary was built without CUDA (make CUDA=0); use device: cpu");
}
int cuda_device_count() { return 0; }
DeviceCaps cuda_device_caps(int) { return {}; }
}  // namespace gpt
