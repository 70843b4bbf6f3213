// A residual basic block (He et al. 2016) as one composite layer: main path conv3x3(stride S) ->
// BN -> ReLU -> conv3x3 -> BN, skip path the identity or, when the shape changes, conv1x1(stride
// S) -> BN, then out = relu(main + skip). It owns its sub-layers (the ordinary Conv2d, BatchNorm
// and ReLU layers) and its intermediate activations; names and layout: docs/model-spec.md.
#pragma once

#include <cstdint>
#include <memory>

#include "nn/nn.hpp"

namespace mpt::nn {

class ResBlock final : public Layer {
 public:
  // INPUT_SHAPE is the per-sample (C_in, H, W); CHANNELS and STRIDE >= 1.
  ResBlock(std::string name, const Shape& input_shape, std::int64_t channels, std::int64_t stride);
  ~ResBlock() override;

  std::string_view kind() const override { return "resblock"; }
  std::string spec() const override;
  Shape output_shape(const Shape& input_shape) const override;
  double flops_per_sample(const Shape& input_shape) const override;
  std::vector<ParamSpec> param_specs() const override;
  std::vector<BufferSpec> buffer_specs() const override;
  void plan(std::int64_t max_batch, DType precision) override;
  std::int64_t scratch_bytes() const override;
  void set_workspace(ComputeWorkspace* workspace) override;
  void set_device(Device device) override;
  void set_context(const StepContext* context) override;
  std::vector<Row> child_rows() const override;
  std::int64_t stats_values() const override;

  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  bool has_projection() const { return proj_ != nullptr; }

 protected:
  void on_bound() override;

 private:
  // One planned [max_batch, shape...] buffer and its view for the current batch.
  struct Buffer {
    Tensor planned, view;
    Shape shape;  // per sample
  };
  Tensor& batch_view(Buffer& buffer, std::int64_t batch);

  Shape input_shape_, mid_shape_;
  std::int64_t channels_, stride_;
  // In parameter order: conv1, bn1, relu, conv2, bn2[, proj, proj_bn].
  std::vector<std::unique_ptr<Layer>> children_;
  Layer *conv1_, *bn1_, *relu_, *conv2_, *bn2_, *proj_ = nullptr, *proj_bn_ = nullptr;
  // Activations: conv1 out, bn1 out (relu in place), conv2 out, proj out, proj_bn out.
  // Gradients: at the sum, through the main path (two), and the projection's input gradient.
  Buffer conv1_out_, bn1_out_, conv2_out_, proj_out_, proj_bn_out_;
  Buffer grad_sum_, grad_a_, grad_b_, grad_input_;
};

}  // namespace mpt::nn
