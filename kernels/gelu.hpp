// GELU, forward and backward, in its exact erf form (PyTorch's default, approximate='none'):
// gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). Elementwise over f32 tensors.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
}  // namespace host

// Y = gelu(X); same number of elements, f32, may alias.
inline void gelu_forward(const Tensor& x, Tensor& y) {
  if (x.device() != Device::cpu) detail::built_without_cuda("kernels::gelu_forward");
  host::gelu_forward(x, y);
}

// DX = DY * gelu'(X) = DY * (Phi(X) + X phi(X)), from the forward's input X; DX may alias DY.
inline void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (x.device() != Device::cpu) detail::built_without_cuda("kernels::gelu_backward");
  host::gelu_backward(x, dy, dx);
}

}  // namespace mpt::kernels
