// BatchNorm forward and backward, every pass where the kernels run: the kernels produce
// per-channel sums in FP32 (accumulated in double) with the sample count after them, an
// optional StatsReducer sums them across ranks in place (on the cuda device, on the device:
// docs/architecture.md "BatchNorm across ranks"), and the per-channel arithmetic
// (kernels::batchnorm_forward_coefs/backward_coefs: C values, in double, the count read from
// the sums) runs before the elementwise passes. Nothing comes back to the host.
#include "nn/batchnorm.hpp"

#include "core/error.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/cast.hpp"

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
}  // namespace

BatchNorm::BatchNorm(std::string name, const Shape& input_shape) : Layer(std::move(name)) {
  if (input_shape.empty() || input_shape[0] < 1 || shape_numel(input_shape) < 1)
    abort_job("nn::BatchNorm " + this->name() + ": bad input shape " +
              shape_to_string(input_shape));
  channels_ = input_shape[0];
  plane_ = shape_numel(input_shape) / channels_;
  // Small (9C + 1 floats) and sized by the layer alone, so allocated here, at build.
  scratch_ = Tensor({9 * channels_ + 1}, DType::f32);
  at_ = views_of(scratch_, channels_);
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
  views.backward_sums = Tensor::view(scratch, 0, {2 * c});  // the count after them is the forward's
  return views;
}

void BatchNorm::set_device(Device device) {
  Layer::set_device(device);
  if (scratch_.device() == device) return;
  scratch_ = Tensor(scratch_.shape(), DType::f32, device);
  at_ = views_of(scratch_, channels_);
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
  last_training_ = training;
  if (training) {
    // Sums and the sample count (on the device, the count too: the host needs no global batch).
    kernels::batchnorm_sums(x, channels_, at_.sums);
    if (context_ && context_->stats_reducer) context_->stats_reducer(at_.sums);
  }
  // A batch without a sample on any rank normalises nothing and leaves the running statistics.
  kernels::batchnorm_forward_coefs(at_.sums, static_cast<double>(plane_), training,
                                   param_value(kGamma), param_value(kBeta),
                                   buffer_value(kRunningMean), buffer_value(kRunningVar), kMomentum,
                                   kEpsilon, at_.mean, at_.invstd, at_.scale, at_.shift);
  kernels::batchnorm_apply(x, channels_, at_.scale, at_.shift, y);
}

void BatchNorm::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  const std::int64_t c = channels_;
  // sums[k] = sum dy, sums[C + k] = sum dy * xhat, this rank's batch; sums[2C] stays the
  // forward's sample count (global under a stats reducer).
  kernels::batchnorm_backward_sums(x, dy, c, at_.mean, at_.invstd, at_.sums);
  // dgamma = sum dy * xhat, dbeta = sum dy: this rank's share; the gradient all-reduce adds the
  // others, as for every other parameter. Taken before any reduction of the sums.
  kernels::cast(at_.sum_dy_xhat, param_grad(kGamma));
  kernels::cast(at_.sum_dy, param_grad(kBeta));
  if (!dx) return;
  // Through the batch statistics after a training forward (plane > 0), else they were constants.
  if (last_training_ && context_ && context_->stats_reducer)
    context_->stats_reducer(at_.backward_sums);
  kernels::batchnorm_backward_coefs(at_.sums, last_training_ ? static_cast<double>(plane_) : 0.0,
                                    param_value(kGamma), at_.invstd, at_.dy_coef, at_.x_coef,
                                    at_.bias);
  kernels::batchnorm_backward_dx(x, dy, c, at_.mean, at_.dy_coef, at_.x_coef, at_.bias, *dx);
}

}  // namespace mpt::nn
