// Flatten as a layer: (C, H, W) -> (C*H*W). A view: the model gives its output the previous
// layer's buffer (and its gradient the previous gradient's), so forward and backward copy
// nothing; only a flatten of the model's input itself copies.
#pragma once

#include "kernels/cast.hpp"
#include "nn/nn.hpp"

namespace mpt::nn {

class FlattenLayer final : public Layer {
 public:
  explicit FlattenLayer(std::string name) : Layer(std::move(name)) {}

  std::string_view kind() const override { return "flatten"; }
  std::string spec() const override { return "flatten"; }
  Shape output_shape(const Shape& input_shape) const override { return {shape_numel(input_shape)}; }
  double flops_per_sample(const Shape&) const override { return 0; }
  bool output_aliases_input() const override { return true; }

  void forward(const Tensor& x, Tensor& y, bool) override {
    if (y.raw() == x.raw()) return;
    // Only as the first layer: the model's f32 input into a buffer of the model's precision (a
    // plain copy under f32, on either device).
    kernels::cast(x, y);
  }
  void backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx) override {
    if (dx && dx->raw() != dy.raw()) kernels::cast(dy, *dx);
  }
};

}  // namespace mpt::nn
