// Batch normalisation as a layer: BatchNorm2d over (C,H,W) samples (statistics per channel over
// N, H, W) or BatchNorm1d over (C) samples, like PyTorch's with momentum 0.1 and eps 1e-5.
// Statistics are FP32 whatever the storage dtype, and can be summed across ranks (sync BN).
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
  // On the cuda device the kernels get a device copy of the per-channel scratch, and gamma,
  // beta and the running statistics a host copy for the per-channel arithmetic.
  void set_device(Device device) override;

  // Training: normalises with the batch's (global, under a stats reducer) mean and biased
  // variance and moves the running statistics; else normalises with the running statistics.
  void forward(const Tensor& x, Tensor& y, bool training) override;
  // After a training forward, the full gradient through the batch statistics (their sums
  // reduced across ranks under a stats reducer; dgamma and dbeta stay this rank's share, which
  // the gradient all-reduce sums); after an eval forward, the statistics are constants.
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::int64_t channels() const { return channels_; }
  // Only sync BN's statistics go through the host (an MPI all-reduce of the sums).
  std::string graph_blocker() const override {
    return context_ && context_->stats_reducer
               ? "sync BN all-reduces its statistics through the host (--model.sync-bn)"
               : "";
  }

 private:
  // The per-channel scratch's layout (f32, one allocation of 9C + 1): sums (2C + 1: the count
  // rides along; sum dy then sum dy * xhat after backward), mean, invstd, scale, shift, and
  // the three dx coefficients.
  struct ScratchViews {
    Tensor sums, sum_dy, sum_dy_xhat, mean, invstd, scale, shift, dy_coef, x_coef, bias;
    Tensor forward_coefs, backward_coefs;  // mean..shift (4C) and the dx coefficients (3C)
  };
  static ScratchViews views_of(const Tensor& scratch, std::int64_t channels);
  // VALUES (f32 [C]) readable on the host: VALUES itself on the host, else HOST_COPY, copied
  // into (a synchronisation).
  static Tensor& on_host(Tensor& values, Tensor& host_copy);
  // True when the per-channel arithmetic must run on the host although the kernels run on the
  // cuda device: sync BN, whose stats reducer sums host values across ranks.
  bool arithmetic_on_host() const;

  std::int64_t channels_, plane_;
  // The host's scratch: the kernels' own on the host; on the cuda device, where sync BN's
  // per-channel arithmetic runs (arithmetic_on_host).
  Tensor scratch_;
  ScratchViews host_;
  // The same layout where the kernels run (scratch_ itself on the host, a device copy on the
  // cuda device), where the per-channel arithmetic runs too (kernels::batchnorm_*_coefs)
  // unless arithmetic_on_host(): then sums and coefficients cross over, one copy each way.
  Tensor kernel_scratch_;
  ScratchViews kernel_;
  // On the cuda device only: host copies of gamma, beta and the running statistics (4C).
  Tensor host_copies_, gamma_host_, beta_host_, running_mean_host_, running_var_host_;
  bool last_training_ = false;
  double last_count_ = 0;  // values per channel in the last training forward (all ranks)
};

}  // namespace mpt::nn
