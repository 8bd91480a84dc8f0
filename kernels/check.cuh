// Check macros for the CUDA libraries. Each failing call throws gpt::Error naming the library, the call,
// the library's message, the file and the line (gpt::throw_check_failure, common.hpp).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "base/common.hpp"

namespace gpt::detail {

inline void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  const ExitCode code = e == cudaErrorMemoryAllocation ? kExitOutOfMemory : kExitFailure;
  int dev = -1;
  cudaGetDevice(&dev);
  throw_check_failure("CUDA", call,
                      std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") on device " +
                          std::to_string(dev),
                      file, line, code);
}
inline void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw_check_failure("cuBLASLt", call, cublasLtGetStatusName(s) + std::string(": ") + cublasLtGetStatusString(s),
                      file, line, s == CUBLAS_STATUS_ALLOC_FAILED ? kExitOutOfMemory : kExitFailure);
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

}  // namespace gpt::detail

#define CUDA_CHECK(call) ::gpt::detail::cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::gpt::detail::cublas_check((call), #call, __FILE__, __LINE__)
#define CUDNN_CHECK(call) ::gpt::detail::cudnn_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) ::gpt::detail::nccl_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
