// Batch normalisation as a layer: BatchNorm2d over (C,H,W) samples (statistics per channel over
// N, H, W) or BatchNorm1d over (C) samples, like PyTorch's with momentum 0.1 and eps 1e-5.
// Statistics are FP32 whatever the storage dtype, and can be summed across ranks (sync BN)
// where they are: the host never reads them inside a step.
#pragma once

#include <cstdint>

#include "nn/nn.hpp"

namespace mpt::nn {

class BatchNorm final : public Layer {
 public:
  static constexpr double kMomentum = 0.1;
  static constexpr double kEpsilon = 1e-5;

  // INPUT_SHAPE is the per-sample (C,H,W) or (C); channels are its first axis.
  BatchNorm(std::string name, const Shape& input_shape);

  std::string_view kind() const override { return "bn"; }
  std::string spec() const override { return "bn"; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  double flops_per_sample(const Shape& input_shape) const override;
  std::vector<ParamSpec> param_specs() const override;
  std::vector<BufferSpec> buffer_specs() const override;
  std::int64_t scratch_bytes() const override;
  // The per-channel scratch moves with the kernels: all of BatchNorm's arithmetic, per-channel
  // included, runs on the layer's device.
  void set_device(Device device) override;

  // Training: normalises with the batch's (global, under a stats reducer) mean and biased
  // variance and moves the running statistics; else normalises with the running statistics.
  void forward(const Tensor& x, Tensor& y, bool training) override;
  // After a training forward, the full gradient through the batch statistics (their sums
  // reduced across ranks under a stats reducer; dgamma and dbeta stay this rank's share, which
  // the gradient all-reduce sums); after an eval forward, the statistics are constants.
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::int64_t channels() const { return channels_; }
  std::int64_t stats_values() const override { return 2 * channels_ + 1; }

 private:
  // The per-channel scratch's layout (f32, one allocation of 9C + 1): sums (2C + 1: the sample
  // count rides along; sum dy then sum dy * xhat after backward, the count kept), mean, invstd,
  // scale, shift, and the three dx coefficients.
  struct ScratchViews {
    Tensor sums, sum_dy, sum_dy_xhat, backward_sums, mean, invstd, scale, shift, dy_coef, x_coef,
        bias;
  };
  static ScratchViews views_of(const Tensor& scratch, std::int64_t channels);

  std::int64_t channels_, plane_;
  Tensor scratch_;  // where the kernels run
  ScratchViews at_;
  bool last_training_ = false;
};

}  // namespace mpt::nn
