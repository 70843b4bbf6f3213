// ReLU, forward and backward. Elementwise over any shape, in f32, f16 or bf16 (all tensors of
// one call share the dtype); the caller owns every tensor.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
}  // namespace host

// y = max(x, 0), NaN propagates (so that loss scaling sees an overflow). x and y may alias.
inline void relu_forward(const Tensor& x, Tensor& y) {
  if (x.device() != Device::cpu) detail::built_without_cuda("kernels::relu_forward");
  host::relu_forward(x, y);
}

// dx = dy where y > 0, else 0; Y is the forward output. dx and dy may alias.
inline void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.device() != Device::cpu) detail::built_without_cuda("kernels::relu_backward");
  host::relu_backward(y, dy, dx);
}

}  // namespace mpt::kernels
