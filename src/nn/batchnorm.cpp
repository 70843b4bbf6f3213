// BatchNorm forward and backward: the kernels produce per-channel sums in FP32 (accumulated in
// double), an optional StatsReducer sums them across ranks, and the per-channel arithmetic
// (kernels::batchnorm_forward_coefs/backward_coefs: C values, in double) runs before the
// elementwise passes, where the kernels run. Only sync BN on the cuda device does it on the
// host, since its reducer sums host values: the sums come over and the coefficients go back.
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
  // Small (9C + 1 floats) and sized by the layer alone, so allocated here, at build.
  const std::int64_t c = channels_;
  scratch_ = Tensor({9 * c + 1}, DType::f32);
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

Tensor& BatchNorm::on_host(Tensor& values, Tensor& host_copy) {
  if (values.device() == Device::cpu) return values;
  kernels::copy(values, host_copy);
  return host_copy;
}

bool BatchNorm::arithmetic_on_host() const {
  return kernel_scratch_.raw() != scratch_.raw() && context_ && context_->stats_reducer;
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
  const bool reduce = context_ && context_->stats_reducer;
  const bool on_host_side = arithmetic_on_host();
  ScratchViews& at = on_host_side ? host_ : kernel_;
  last_training_ = training;
  double count = 0;
  if (training) {
    kernels::batchnorm_sums(x, c, kernel_.sums);
    if (reduce) {
      // Through the host: on the cuda device a copy of 2C + 1 values and a wait (sync BN).
      mirror(kernel_.sums, host_.sums);
      float* sums = host_.sums.data<float>();
      sums[2 * c] = static_cast<float>(x.dim(0));  // samples: exact in f32 below 2^24
      context_->stats_reducer(sums, 2 * c + 1);
      count = static_cast<double>(sums[2 * c]) * static_cast<double>(plane_);
    } else {
      count = static_cast<double>(static_cast<float>(x.dim(0))) * static_cast<double>(plane_);
    }
    last_count_ = count;
    if (count <= 0) return;  // an empty batch on every rank: nothing to normalise
  }
  Tensor& running_mean =
      on_host_side ? on_host(buffer_value(kRunningMean), running_mean_host_) : buffer_value(kRunningMean);
  Tensor& running_var =
      on_host_side ? on_host(buffer_value(kRunningVar), running_var_host_) : buffer_value(kRunningVar);
  kernels::batchnorm_forward_coefs(
      at.sums, count, training,
      on_host_side ? on_host(param_value(kGamma), gamma_host_) : param_value(kGamma),
      on_host_side ? on_host(param_value(kBeta), beta_host_) : param_value(kBeta), running_mean,
      running_var, kMomentum, kEpsilon, at.mean, at.invstd, at.scale, at.shift);
  if (on_host_side) {
    if (training) {  // the running statistics live on the device
      kernels::copy(running_mean_host_, buffer_value(kRunningMean));
      kernels::copy(running_var_host_, buffer_value(kRunningVar));
    }
    mirror(host_.forward_coefs, kernel_.forward_coefs);  // mean and invstd too: backward's kernels read them
  }
  kernels::batchnorm_apply(x, c, kernel_.scale, kernel_.shift, y);
}

void BatchNorm::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  const std::int64_t c = channels_;
  // sums[k] = sum dy, sums[C + k] = sum dy * xhat, this rank's batch.
  kernels::batchnorm_backward_sums(x, dy, c, kernel_.mean, kernel_.invstd, kernel_.sums);
  // dgamma = sum dy * xhat, dbeta = sum dy: this rank's share; the gradient all-reduce adds the
  // others, as for every other parameter. Taken before any reduction of the sums.
  kernels::cast(kernel_.sum_dy_xhat, param_grad(kGamma));
  kernels::cast(kernel_.sum_dy, param_grad(kBeta));
  if (!dx) return;
  const bool on_host_side = arithmetic_on_host();
  ScratchViews& at = on_host_side ? host_ : kernel_;
  if (on_host_side) mirror(kernel_.sums, host_.sums);
  const bool through_stats = last_training_ && last_count_ > 0;
  if (through_stats && context_ && context_->stats_reducer)
    context_->stats_reducer(at.sums.data<float>(), 2 * c);  // on the host (see arithmetic_on_host)
  kernels::batchnorm_backward_coefs(
      at.sums, through_stats ? last_count_ : 0.0,
      on_host_side ? on_host(param_value(kGamma), gamma_host_) : param_value(kGamma), at.invstd,
      at.dy_coef, at.x_coef, at.bias);
  if (on_host_side) mirror(host_.backward_coefs, kernel_.backward_coefs);
  kernels::batchnorm_backward_dx(x, dy, c, kernel_.mean, kernel_.dy_coef, kernel_.x_coef,
                                 kernel_.bias, *dx);
}

}  // namespace mpt::nn
