// ReLU layer: forward and backward through the relu kernels.
#include "nn/relu_layer.hpp"

#include "kernels/relu.hpp"

namespace mpt::nn {

double ReluLayer::flops_per_sample(const Shape& input_shape) const {
  return static_cast<double>(shape_numel(input_shape));  // one compare per element
}

void ReluLayer::forward(const Tensor& x, Tensor& y, bool) { kernels::relu_forward(x, y); }

void ReluLayer::backward(const Tensor&, const Tensor& y, const Tensor& dy, Tensor* dx) {
  // The mask comes from the output: y > 0 exactly where x > 0.
  if (dx) kernels::relu_backward(y, dy, *dx);
}

}  // namespace mpt::nn
