// The CUDA backend's FP8 ops (backend/fp8_products.hpp), over kernels/fp8_cast, the
// classifier's FP8 gradient (kernels/classifier) and kernels/matmul_fp8. Built by the CUDA backend in
// bf16 precision, on its stream, cuBLASLt handle, profiler and scratch.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "backend/backend.hpp"
#include "backend/fp8_products.hpp"
#include "backend/cuda/op_profiler.cuh"
#include "kernels/matmul.cuh"

namespace gpt {

struct CudaFp8Context {
  cudaStream_t stream = nullptr;
  kern::CublasLt* lt = nullptr;
  OpProfiler* prof = nullptr;
  std::function<void*(size_t)> scratch;  // the backend's shared scratch, at least this many bytes
  fp8::FastAccum fast_accum = fp8::FastAccum::dinp;
};
std::unique_ptr<Fp8Products> make_cuda_fp8_products(const CudaFp8Context& c);

}  // namespace gpt
