// Where the kernels' errors become the program's: the CUDA backend and the NCCL communicator run every
// call into kernels/ and the CUDA libraries through kernel_boundary, which turns a kern::KernelError into
// a gpt::Error with the message kept: out of memory -> kExitOutOfMemory, anything else -> kExitFailure.
#pragma once
#include "base/common.hpp"
#include "kernels/check.cuh"

namespace gpt {

inline Error to_error(const kern::KernelError& e) {
  return Error(e.kind() == kern::KernelError::Kind::kOutOfMemory ? kExitOutOfMemory : kExitFailure, e.what());
}

// fn(), with a KernelError it throws rethrown as the Error above
template <class Fn>
decltype(auto) kernel_boundary(Fn&& fn) {
  try {
    return fn();
  } catch (const kern::KernelError& e) {
    throw to_error(e);
  }
}

}  // namespace gpt
