// ReLU layer: forward and backward through the relu kernels.
#include "nn/relu_layer.hpp"

#include "kernels/cast.hpp"
#include "kernels/relu.hpp"

namespace mpt::nn {

double ReluLayer::flops_per_sample(const Shape& input_shape) const {
  return static_cast<double>(shape_numel(input_shape));  // one compare per element
}

void ReluLayer::forward(const Tensor& x, Tensor& y, bool) {
  if (folded_) return;  // the layer before applied it; y is x's buffer
  if (x.dtype() == y.dtype()) return kernels::relu_forward(x, y);
  // First layer of a 16-bit model: the input batch is f32. Rounding commutes with relu (both
  // keep the sign and map 0 to 0), so round into y, then relu in place.
  kernels::cast(x, y);
  kernels::relu_forward(y, y);
}

void ReluLayer::backward(const Tensor&, const Tensor& y, const Tensor& dy, Tensor* dx) {
  // The mask comes from the output: y > 0 exactly where x > 0. Folded: dx is dy's buffer, and
  // the layer before masks it.
  if (dx && !folded_) kernels::relu_backward(y, dy, *dx);
}

}  // namespace mpt::nn
