// GELU as a layer, exact erf form (PyTorch's nn.GELU() default): no parameters, same shape in
// and out.
#pragma once

#include "nn/nn.hpp"
#include "nn/sample_staging.hpp"

namespace mpt::nn {

class GeluLayer final : public Layer {
 public:
  GeluLayer(std::string name, const Shape& input_shape)
      : Layer(std::move(name)), sample_numel_(shape_numel(input_shape)) {}

  std::string_view kind() const override { return "gelu"; }
  std::string spec() const override { return "gelu"; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  double flops_per_sample(const Shape& input_shape) const override;
  void plan(std::int64_t max_batch, DType precision) override;
  std::int64_t scratch_bytes() const override { return staging_.scratch_bytes(); }

  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

 private:
  std::int64_t sample_numel_;
  std::int64_t run_ = 1;  // samples per staged run under 16-bit storage
  SampleStaging staging_;
};

}  // namespace mpt::nn
