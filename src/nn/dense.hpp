// Fully connected layer, Y = X·Wᵀ + b with W stored (out, in) like PyTorch's nn.Linear.
#pragma once

#include <cstdint>

#include "nn/nn.hpp"

namespace mpt::nn {

class Dense final : public Layer {
 public:
  Dense(std::string name, std::int64_t in_features, std::int64_t out_features);

  std::string_view kind() const override { return "dense"; }
  std::string spec() const override;
  Shape output_shape(const Shape& input_shape) const override;
  double flops_per_sample(const Shape& input_shape) const override;
  std::vector<ParamSpec> param_specs() const override;

  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }

 private:
  std::int64_t in_features_;
  std::int64_t out_features_;
};

}  // namespace mpt::nn
