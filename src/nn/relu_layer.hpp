// ReLU as a layer: no parameters, same shape in and out.
#pragma once

#include "nn/nn.hpp"

namespace mpt::nn {

class ReluLayer final : public Layer {
 public:
  explicit ReluLayer(std::string name) : Layer(std::move(name)) {}

  std::string_view kind() const override { return "relu"; }
  std::string spec() const override { return "relu"; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  double flops_per_sample(const Shape& input_shape) const override;

  // Folded into the layer before it (Layer::fuse_following_relu): the output is the input's
  // buffer, and forward and backward have nothing left to do.
  void fold_into_previous() { folded_ = true; }
  bool folded() const { return folded_; }
  bool output_aliases_input() const override { return folded_; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

 private:
  bool folded_ = false;
};

}  // namespace mpt::nn
