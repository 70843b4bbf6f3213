// BatchNorm forward and backward: the kernels produce per-channel sums in FP32 (accumulated in
// double), an optional StatsReducer sums them across ranks, and the per-channel arithmetic here
// (C values) runs in double before the elementwise passes. On the cuda device that arithmetic
// stays on the host: the sums come over and the coefficients go back, C-sized copies.
#include "nn/batchnorm.hpp"

#include <cmath>

#include "core/error.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/cast.hpp"
#include "kernels/copy.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kGamma = 0, kBeta = 1;
constexpr std::size_t kRunningMean = 0, kRunningVar = 1;

// The next N elements of the flat SCRATCH from AT on, as a view; AT moves past them.
Tensor take(const Tensor& scratch, std::int64_t& at, std::int64_t n) {
  Tensor view = Tensor::view(scratch, at, {n});
  at += n;
  return view;
}

// FROM into TO, unless they are one tensor (on the host the kernels' views are the host's).
void mirror(const Tensor& from, Tensor& to) {
  if (from.raw() != to.raw()) kernels::copy(from, to);
}
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
  host_ = views_of(scratch_, c);
  kernel_scratch_ = scratch_;
  kernel_ = host_;
}

BatchNorm::ScratchViews BatchNorm::views_of(const Tensor& scratch, std::int64_t c) {
  ScratchViews views;
  std::int64_t at = 0;
  views.sums = take(scratch, at, 2 * c + 1);
  views.mean = take(scratch, at, c);
  views.invstd = take(scratch, at, c);
  views.scale = take(scratch, at, c);
  views.shift = take(scratch, at, c);
  views.dy_coef = take(scratch, at, c);
  views.x_coef = take(scratch, at, c);
  views.bias = take(scratch, at, c);
  views.dgamma = take(scratch, at, c);
  views.dbeta = take(scratch, at, c);
  views.sum_dy = Tensor::view(scratch, 0, {c});
  views.sum_dy_xhat = Tensor::view(scratch, c, {c});
  views.forward_coefs = Tensor::view(scratch, 2 * c + 1, {4 * c});
  views.backward_coefs = Tensor::view(scratch, 6 * c + 1, {3 * c});
  return views;
}

void BatchNorm::set_device(Device device) {
  Layer::set_device(device);
  if (device == Device::cpu) {
    kernel_scratch_ = scratch_;
    kernel_ = host_;
    host_copies_ = gamma_host_ = beta_host_ = running_mean_host_ = running_var_host_ = Tensor();
    return;
  }
  const std::int64_t c = channels_;
  kernel_scratch_ = Tensor(scratch_.shape(), DType::f32, device);
  kernel_ = views_of(kernel_scratch_, c);
  host_copies_ = Tensor({4 * c}, DType::f32);
  std::int64_t at = 0;
  gamma_host_ = take(host_copies_, at, c);
  beta_host_ = take(host_copies_, at, c);
  running_mean_host_ = take(host_copies_, at, c);
  running_var_host_ = take(host_copies_, at, c);
}

float* BatchNorm::on_host(Tensor& values, Tensor& host_copy) {
  if (values.device() == Device::cpu) return values.data<float>();
  kernels::copy(values, host_copy);
  return host_copy.data<float>();
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
  std::int64_t bytes = static_cast<std::int64_t>(scratch_.size_bytes());
  if (kernel_scratch_.raw() != scratch_.raw())
    bytes += static_cast<std::int64_t>(kernel_scratch_.size_bytes() + host_copies_.size_bytes());
  return bytes;
}

void BatchNorm::forward(const Tensor& x, Tensor& y, bool training) {
  const std::int64_t c = channels_;
  // On the cuda device each of these, and each mirror() below, is a C-sized copy that waits
  // for the device: the per-channel arithmetic runs on the host (docs/gpu.md).
  const float* gamma = on_host(param_value(kGamma), gamma_host_);
  const float* beta = on_host(param_value(kBeta), beta_host_);
  float* running_mean = on_host(buffer_value(kRunningMean), running_mean_host_);
  float* running_var = on_host(buffer_value(kRunningVar), running_var_host_);
  float* mean = host_.mean.data<float>();
  float* invstd = host_.invstd.data<float>();
  last_training_ = training;
  if (training) {
    kernels::batchnorm_sums(x, c, kernel_.sums);
    mirror(kernel_.sums, host_.sums);
    float* sums = host_.sums.data<float>();
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
    if (running_mean_host_.defined()) {  // the running statistics live on the device
      kernels::copy(running_mean_host_, buffer_value(kRunningMean));
      kernels::copy(running_var_host_, buffer_value(kRunningVar));
    }
  } else {
    for (std::int64_t k = 0; k < c; ++k) {
      mean[k] = running_mean[k];
      invstd[k] = static_cast<float>(1.0 / std::sqrt(double{running_var[k]} + kEpsilon));
    }
  }
  // y = (x - mean) * invstd * gamma + beta = x * scale + shift.
  float* scale = host_.scale.data<float>();
  float* shift = host_.shift.data<float>();
  for (std::int64_t k = 0; k < c; ++k) {
    const double s = double{gamma[k]} * invstd[k];
    scale[k] = static_cast<float>(s);
    shift[k] = static_cast<float>(beta[k] - mean[k] * s);
  }
  mirror(host_.forward_coefs,
         kernel_.forward_coefs);  // mean and invstd too: backward's kernels read them
  kernels::batchnorm_apply(x, c, kernel_.scale, kernel_.shift, y);
}

void BatchNorm::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  const std::int64_t c = channels_;
  // host_.sums[k] = sum dy, host_.sums[C + k] = sum dy * xhat, this rank's batch.
  kernels::batchnorm_backward_sums(x, dy, c, kernel_.mean, kernel_.invstd, kernel_.sums);
  // dgamma = sum dy * xhat, dbeta = sum dy: this rank's share; the gradient all-reduce adds the
  // others, as for every other parameter. Copied where the kernels run, before any reduction.
  kernels::copy(kernel_.sum_dy_xhat, kernel_.dgamma);
  kernels::copy(kernel_.sum_dy, kernel_.dbeta);
  kernels::cast(kernel_.dgamma, param_grad(kGamma));
  kernels::cast(kernel_.dbeta, param_grad(kBeta));
  if (!dx) return;
  mirror(kernel_.sums, host_.sums);
  float* sums = host_.sums.data<float>();
  const float* gamma = on_host(param_value(kGamma), gamma_host_);
  const float* invstd = host_.invstd.data<float>();
  float* k1 = host_.dy_coef.data<float>();
  float* k2 = host_.x_coef.data<float>();
  float* k3 = host_.bias.data<float>();
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
  mirror(host_.backward_coefs, kernel_.backward_coefs);
  kernels::batchnorm_backward_dx(x, dy, c, kernel_.mean, kernel_.dy_coef, kernel_.x_coef,
                                 kernel_.bias, *dx);
}

}  // namespace mpt::nn
