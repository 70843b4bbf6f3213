// BatchNorm forward and backward: the kernels produce per-channel sums in FP32 (accumulated in
// double), an optional StatsReducer sums them across ranks, and the per-channel arithmetic here
// (C values) runs in double before the elementwise passes.
#include "nn/batchnorm.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/cast.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kGamma = 0, kBeta = 1;
constexpr std::size_t kRunningMean = 0, kRunningVar = 1;
}  // namespace

BatchNorm::BatchNorm(std::string name, const Shape& input_shape) : Layer(std::move(name)) {
  if (input_shape.empty() || input_shape[0] < 1 || shape_numel(input_shape) < 1)
    abort_job("nn::BatchNorm " + this->name() + ": bad input shape " +
              shape_to_string(input_shape));
  channels_ = input_shape[0];
  plane_ = shape_numel(input_shape) / channels_;
  // Small (13C + 1 floats) and sized by the layer alone, so allocated here, at build.
  const std::int64_t c = channels_;
  scratch_ = Tensor({13 * c + 1}, DType::f32);
  std::int64_t at = 0;
  const auto take = [&](Tensor& t, std::int64_t n) {
    t = Tensor::view(scratch_, at, {n});
    at += n;
  };
  take(sums_, 2 * c + 1);
  take(mean_, c);
  take(invstd_, c);
  take(scale_, c);
  take(shift_, c);
  take(dy_coef_, c);
  take(x_coef_, c);
  take(bias_, c);
  take(grads_f32_, 2 * c);
  dgamma_view_ = Tensor::view(grads_f32_, 0, {c});
  dbeta_view_ = Tensor::view(grads_f32_, c, {c});
}

double BatchNorm::flops_per_sample(const Shape& input_shape) const {
  // Statistics (add, multiply-add) and the affine map (multiply-add) per element.
  return 5.0 * static_cast<double>(shape_numel(input_shape));
}

std::vector<ParamSpec> BatchNorm::param_specs() const {
  // gamma = 1, beta = 0, as torch.nn.BatchNorm2d's reset_parameters.
  return {{"gamma", {channels_}, 0.f, 1.f}, {"beta", {channels_}, 0.f, 0.f}};
}

std::vector<BufferSpec> BatchNorm::buffer_specs() const {
  return {{"running_mean", {channels_}, 0.f}, {"running_var", {channels_}, 1.f}};
}

std::int64_t BatchNorm::scratch_bytes() const {
  return static_cast<std::int64_t>(scratch_.size_bytes());
}

void BatchNorm::forward(const Tensor& x, Tensor& y, bool training) {
  const std::int64_t c = channels_;
  const float* gamma = param_value(kGamma).data<float>();
  const float* beta = param_value(kBeta).data<float>();
  float* running_mean = buffer_value(kRunningMean).data<float>();
  float* running_var = buffer_value(kRunningVar).data<float>();
  float* mean = mean_.data<float>();
  float* invstd = invstd_.data<float>();
  last_training_ = training;
  if (training) {
    kernels::batchnorm_sums(x, c, sums_);
    float* sums = sums_.data<float>();
    sums[2 * c] = static_cast<float>(x.dim(0));  // samples: exact in f32 below 2^24
    if (context_ && context_->stats_reducer) context_->stats_reducer(sums, 2 * c + 1);
    const double count = static_cast<double>(sums[2 * c]) * static_cast<double>(plane_);
    last_count_ = count;
    if (count <= 0) return;  // an empty batch on every rank: nothing to normalise
    // Unbiased variance for the running estimate, as PyTorch (M/(M-1); M = 1 keeps it biased).
    const double unbias = count > 1 ? count / (count - 1) : 1.0;
    for (std::int64_t k = 0; k < c; ++k) {
      const double m = sums[k] / count;
      const double var = std::max(0.0, sums[c + k] / count - m * m);
      mean[k] = static_cast<float>(m);
      invstd[k] = static_cast<float>(1.0 / std::sqrt(var + kEpsilon));
      running_mean[k] = static_cast<float>((1 - kMomentum) * running_mean[k] + kMomentum * m);
      running_var[k] =
          static_cast<float>((1 - kMomentum) * running_var[k] + kMomentum * var * unbias);
    }
  } else {
    for (std::int64_t k = 0; k < c; ++k) {
      mean[k] = running_mean[k];
      invstd[k] = static_cast<float>(1.0 / std::sqrt(double{running_var[k]} + kEpsilon));
    }
  }
  // y = (x - mean) * invstd * gamma + beta = x * scale + shift.
  float* scale = scale_.data<float>();
  float* shift = shift_.data<float>();
  for (std::int64_t k = 0; k < c; ++k) {
    const double s = double{gamma[k]} * invstd[k];
    scale[k] = static_cast<float>(s);
    shift[k] = static_cast<float>(beta[k] - mean[k] * s);
  }
  kernels::batchnorm_apply(x, c, scale_, shift_, y);
}

void BatchNorm::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  const std::int64_t c = channels_;
  // sums_[k] = sum dy, sums_[C + k] = sum dy * xhat, this rank's batch.
  kernels::batchnorm_backward_sums(x, dy, c, mean_, invstd_, sums_);
  float* sums = sums_.data<float>();
  // dgamma = sum dy * xhat, dbeta = sum dy: this rank's share; the gradient all-reduce adds the
  // others, as for every other parameter.
  std::memcpy(dgamma_view_.raw(), sums + c, static_cast<std::size_t>(c) * sizeof(float));
  std::memcpy(dbeta_view_.raw(), sums, static_cast<std::size_t>(c) * sizeof(float));
  kernels::cast(dgamma_view_, param_grad(kGamma));
  kernels::cast(dbeta_view_, param_grad(kBeta));
  if (!dx) return;
  const float* gamma = param_value(kGamma).data<float>();
  const float* invstd = invstd_.data<float>();
  float* k1 = dy_coef_.data<float>();
  float* k2 = x_coef_.data<float>();
  float* k3 = bias_.data<float>();
  const bool through_stats = last_training_ && last_count_ > 0;
  if (through_stats && context_ && context_->stats_reducer) context_->stats_reducer(sums, 2 * c);
  for (std::int64_t k = 0; k < c; ++k) {
    // dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) invstd; with
    // running statistics (eval) only the first term.
    const double g = double{gamma[k]} * invstd[k];
    k1[k] = static_cast<float>(g);
    k2[k] = through_stats ? static_cast<float>(-g * invstd[k] * sums[c + k] / last_count_) : 0.f;
    k3[k] = through_stats ? static_cast<float>(-g * sums[k] / last_count_) : 0.f;
  }
  kernels::batchnorm_backward_dx(x, dy, c, mean_, dy_coef_, x_coef_, bias_, *dx);
}

}  // namespace mpt::nn
