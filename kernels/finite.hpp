// A finite test over a tensor of floating-point storage, for the numerics check that names the
// first layer whose activations went non-finite.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
bool all_finite(const Tensor& x);
}  // namespace host

// True when no element of X (f32, f16 or bf16, any shape) is Inf or NaN.
inline bool all_finite(const Tensor& x) {
  if (x.device() != Device::cpu) detail::built_without_cuda("kernels::all_finite");
  return host::all_finite(x);
}

}  // namespace mpt::kernels
