// Check macros for the CUDA libraries, and the error type the kernels throw. Each failing call throws
// kern::KernelError naming the library, the call, the library's message, the file and the line. The
// kernels know no exit statuses: the backend turns a KernelError into the program's error where its ops
// return (src/backend/cuda/kernel_boundary.cuh).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace gpt::kern {

class KernelError : public std::runtime_error {
 public:
  enum class Kind {
    kFailure,      // a library or launch error
    kOutOfMemory,  // an allocation failed
    kUnsupported,  // no kernel or library algorithm takes these arguments
  };
  KernelError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

namespace detail {

// "<lib> call failed: <call>: <detail> (<file>:<line>)"
[[noreturn]] inline void throw_check_failure(const char* lib, const char* call, const std::string& detail,
                                             const char* file, int line,
                                             KernelError::Kind kind = KernelError::Kind::kFailure) {
  std::string what = std::string(lib) + " call failed: " + call;
  if (!detail.empty()) what += ": " + detail;
  what += " (" + std::string(file) + ":" + std::to_string(line) + ")";
  throw KernelError(kind, what);
}

inline void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  int dev = -1;
  cudaGetDevice(&dev);
  throw_check_failure("CUDA", call,
                      std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") on device " +
                          std::to_string(dev),
                      file, line,
                      e == cudaErrorMemoryAllocation ? KernelError::Kind::kOutOfMemory : KernelError::Kind::kFailure);
}
inline void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw_check_failure("cuBLASLt", call, cublasLtGetStatusName(s) + std::string(": ") + cublasLtGetStatusString(s),
                      file, line,
                      s == CUBLAS_STATUS_ALLOC_FAILED ? KernelError::Kind::kOutOfMemory : KernelError::Kind::kFailure);
}
inline void cudnn_check(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  throw_check_failure("cuDNN", call, cudnnGetErrorString(s), file, line);
}
// cudnn_frontend::error_object (or anything with is_bad() / get_message()), without including the frontend.
template <class E>
inline void cudnn_check(E e, const char* call, const char* file, int line) {  // by value: get_message() is non-const
  if (!e.is_bad()) return;
  throw_check_failure("cuDNN frontend", call, e.get_message(), file, line);
}
inline void nccl_check(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess) return;
  throw_check_failure("NCCL", call, ncclGetErrorString(r), file, line);
}

}  // namespace detail
}  // namespace gpt::kern

#define CUDA_CHECK(call) ::gpt::kern::detail::cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::gpt::kern::detail::cublas_check((call), #call, __FILE__, __LINE__)
#define CUDNN_CHECK(call) ::gpt::kern::detail::cudnn_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) ::gpt::kern::detail::nccl_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
