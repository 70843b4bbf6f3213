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
// The CUDA twins (kernels/cuda/relu.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
}  // namespace cuda

// y = max(x, 0), NaN propagates (so that loss scaling sees an overflow). x and y may alias.
inline void relu_forward(const Tensor& x, Tensor& y) {
  detail::require_same_or_disjoint("kernels::relu_forward", "y must be x or not overlap it", x, y);
  MPT_DISPATCH_CUDA(x, relu_forward, x, y);
  host::relu_forward(x, y);
}

// dx = dy where y > 0, else 0; Y is the forward output. dx and dy may alias.
inline void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::require_same_or_disjoint("kernels::relu_backward", "dx must be y or not overlap it", y,
                                   dx);
  detail::require_same_or_disjoint("kernels::relu_backward", "dx must be dy or not overlap it", dy,
                                   dx);
  MPT_DISPATCH_CUDA(y, relu_backward, y, dy, dx);
  host::relu_backward(y, dy, dx);
}

}  // namespace mpt::kernels
