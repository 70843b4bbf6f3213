// A finite test over a tensor of floating-point storage, for the numerics check that names the
// first layer whose activations went non-finite.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
bool all_finite(const Tensor& x);
}  // namespace host
// The CUDA twins (kernels/cuda/finite.cu), same contracts, every tensor on the cuda device.
namespace cuda {
bool all_finite(const Tensor& x);
}  // namespace cuda

// True when no element of X (f32, f16 or bf16, any shape) is Inf or NaN.
inline bool all_finite(const Tensor& x) {
  MPT_DISPATCH_CUDA(x, all_finite, x);
  return host::all_finite(x);
}

}  // namespace mpt::kernels
