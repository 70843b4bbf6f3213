// Pooling layers: the whole batch in one kernel call under f32 (a batch is a run of planes), and
// max pooling's under 16-bit storage too (it only selects, so it runs on the stored bits; its
// backward where the windows are disjoint). The rest under 16-bit storage, and a batch not in
// the storage dtype (the model's f32 input), goes in runs of samples through f32 staging (one
// sample on the host). On the cuda device, cuDNN pools the whole batch in its storage dtype
// (CudaConvPath::cudnn).
#include "nn/pool2d_layer.hpp"

#include <algorithm>
#include <climits>

#include "core/error.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kInSlot = 0, kOutSlot = 1, kDoutSlot = 2, kDinSlot = 3;
}

Pool2dLayer::Pool2dLayer(std::string name, PoolMode mode, const Shape& input_shape,
                         std::int64_t kernel, std::int64_t stride)
    : Layer(std::move(name)), mode_(mode) {
  if (input_shape.size() != 3) abort_job("nn::Pool2dLayer " + this->name() + ": needs (C,H,W)");
  channels_ = input_shape[0];
  if (mode == PoolMode::global_average)
    geometry_ = {input_shape[1], input_shape[2], input_shape[1], input_shape[2], 1};
  else
    geometry_ = {input_shape[1], input_shape[2], kernel, kernel, stride};
  if (geometry_.kernel_h < 1 || geometry_.stride < 1 || geometry_.kernel_h > geometry_.height ||
      geometry_.kernel_w > geometry_.width)
    abort_job("nn::Pool2dLayer " + this->name() + ": window does not fit " +
              shape_to_string(input_shape));
  disjoint_ = geometry_.stride == geometry_.kernel_h && geometry_.stride == geometry_.kernel_w;
}

std::string_view Pool2dLayer::kind() const {
  switch (mode_) {
    case PoolMode::max:
      return "maxpool";
    case PoolMode::average:
      return "avgpool";
    case PoolMode::global_average:
      break;
  }
  return "gap";
}

std::string Pool2dLayer::spec() const {
  if (mode_ == PoolMode::global_average) return "gap";
  std::string text = std::string(kind()) + ":" + std::to_string(geometry_.kernel_h);
  if (geometry_.stride != geometry_.kernel_h) text += ":stride=" + std::to_string(geometry_.stride);
  return text;
}

Shape Pool2dLayer::output_shape(const Shape&) const {
  if (mode_ == PoolMode::global_average) return {channels_};
  return {channels_, geometry_.out_height(), geometry_.out_width()};
}

double Pool2dLayer::flops_per_sample(const Shape&) const {
  // One compare or add per window element.
  return static_cast<double>(channels_ * geometry_.out_height() * geometry_.out_width() *
                             geometry_.kernel_h * geometry_.kernel_w);
}

void Pool2dLayer::plan(std::int64_t max_batch, DType precision) {
  const std::int64_t in = channels_ * geometry_.height * geometry_.width;
  const std::int64_t out = channels_ * geometry_.out_height() * geometry_.out_width();
  run_ = SampleStaging::run_samples(device_, in, max_batch);
  staging_.plan(precision, device_, {run_ * in, run_ * out, run_ * out, run_ * in});
  storage_ = precision;
  uses_cudnn_ = false;
#ifdef MPTRAIN_HAVE_CUDNN
  // cuDNN indexes a tensor with 32-bit integers: a larger batch keeps the CUDA twins.
  if (device_ == Device::cuda && cuda_conv_path() == CudaConvPath::cudnn &&
      max_batch * std::max(in, out) <= INT_MAX) {
    cudnn_.plan(geometry_, channels_, precision, mode_ == PoolMode::max);
    uses_cudnn_ = true;
  }
#endif
}

void Pool2dLayer::forward(const Tensor& x, Tensor& y, bool) {
#ifdef MPTRAIN_HAVE_CUDNN
  if (uses_cudnn_ && x.dtype() == storage_ && y.dtype() == storage_) return cudnn_.forward(x, y);
#endif
  const std::int64_t in = channels_ * geometry_.height * geometry_.width;
  const std::int64_t out = channels_ * geometry_.out_height() * geometry_.out_width();
  if (mode_ == PoolMode::max && x.dtype() == y.dtype())
    return kernels::max_pool2d_forward(x, geometry_, y);
  const bool f32 = x.dtype() == DType::f32 && y.dtype() == DType::f32;
  // Under f32 the batch is one run of planes: a single call.
  const std::int64_t batch = x.dim(0), run = f32 ? std::max<std::int64_t>(1, batch) : run_;
  for (std::int64_t first = 0; first < batch; first += run) {
    const std::int64_t count = std::min(run, batch - first);
    const Tensor& x_f32 = staging_.read_run(x, first, count, in, kInSlot);
    Tensor& y_f32 = staging_.write_run(y, first, count, out, kOutSlot);
    if (mode_ == PoolMode::max)
      kernels::max_pool2d_forward(x_f32, geometry_, y_f32);
    else
      kernels::avg_pool2d_forward(x_f32, geometry_, y_f32);
    staging_.commit(kOutSlot);
  }
}

void Pool2dLayer::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  if (!dx) return;  // no parameters
#ifdef MPTRAIN_HAVE_CUDNN
  if (uses_cudnn_ && x.dtype() == storage_ && y.dtype() == storage_ && dy.dtype() == storage_ &&
      dx->dtype() == storage_)
    return cudnn_.backward(x, y, dy, *dx);
#else
  (void)y;
#endif
  const std::int64_t in = channels_ * geometry_.height * geometry_.width;
  const std::int64_t out = channels_ * geometry_.out_height() * geometry_.out_width();
  if (mode_ == PoolMode::max && x.dtype() == dy.dtype() && dx->dtype() == x.dtype() &&
      (x.dtype() == DType::f32 || disjoint_))
    return kernels::max_pool2d_backward(x, geometry_, dy, *dx);
  const bool f32 = x.dtype() == DType::f32 && dy.dtype() == DType::f32;
  const std::int64_t batch = x.dim(0), run = f32 ? std::max<std::int64_t>(1, batch) : run_;
  for (std::int64_t first = 0; first < batch; first += run) {
    const std::int64_t count = std::min(run, batch - first);
    const Tensor& dy_f32 = staging_.read_run(dy, first, count, out, kDoutSlot);
    Tensor& dx_f32 = staging_.write_run(*dx, first, count, in, kDinSlot);
    if (mode_ == PoolMode::max)
      kernels::max_pool2d_backward(staging_.read_run(x, first, count, in, kInSlot), geometry_,
                                   dy_f32, dx_f32);
    else
      kernels::avg_pool2d_backward(geometry_, dy_f32, dx_f32);
    staging_.commit(kDinSlot);
  }
}

}  // namespace mpt::nn
