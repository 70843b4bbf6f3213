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
// The CUDA twins (kernels/cuda/gelu.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
}  // namespace cuda

// Y = gelu(X); same number of elements, f32, may alias.
inline void gelu_forward(const Tensor& x, Tensor& y) {
  detail::require_same_or_disjoint("kernels::gelu_forward", "y must be x or not overlap it", x, y);
  MPT_DISPATCH_CUDA(x, gelu_forward, x, y);
  host::gelu_forward(x, y);
}

// DX = DY * gelu'(X) = DY * (Phi(X) + X phi(X)), from the forward's input X; DX may alias DY.
inline void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  detail::require_same_or_disjoint("kernels::gelu_backward", "dx must be x or not overlap it", x,
                                   dx);
  detail::require_same_or_disjoint("kernels::gelu_backward", "dx must be dy or not overlap it", dy,
                                   dx);
  MPT_DISPATCH_CUDA(x, gelu_backward, x, dy, dx);
  host::gelu_backward(x, dy, dx);
}

}  // namespace mpt::kernels
