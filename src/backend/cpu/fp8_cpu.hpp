// The CPU backend's FP8 ops: the emulation of FP8 training every GPU kernel is tested against. Values are
// quantized to real FP8 bytes (base/fp8.hpp) with the same power-of-two scales the GPU uses, products
// are fp32 BLAS over the dequantized operands.
#pragma once
#include <memory>

#include "backend/backend.hpp"
#include "backend/fp8_products.hpp"
#include "backend/op_tally.hpp"

namespace gpt {

// be: the CPU backend itself (its fp32 products are reused); tally: its op profile
std::unique_ptr<Fp8Products> make_cpu_fp8_products(Backend& be, OpTally& tally);

}  // namespace gpt
