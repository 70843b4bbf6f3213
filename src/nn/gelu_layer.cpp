// GELU layer: the whole batch in one kernel call under f32, one sample at a time through f32
// staging under 16-bit storage. The backward needs the forward's input X, not its output.
#include "nn/gelu_layer.hpp"

#include "kernels/gelu.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kInSlot = 0, kOutSlot = 1, kDoutSlot = 2, kDinSlot = 3;
}

double GeluLayer::flops_per_sample(const Shape& input_shape) const {
  // erf, a multiply-add and a multiply: counted as 4 per element (a convention, like PyTorch's
  // profiler counting elementwise ops as a handful of FLOPs).
  return 4.0 * static_cast<double>(shape_numel(input_shape));
}

void GeluLayer::plan(std::int64_t, DType precision) {
  staging_.plan(precision, {sample_numel_, sample_numel_, sample_numel_, sample_numel_});
}

void GeluLayer::forward(const Tensor& x, Tensor& y, bool) {
  const bool f32 = x.dtype() == DType::f32 && y.dtype() == DType::f32;
  const std::int64_t samples = f32 ? 1 : x.dim(0), n = f32 ? x.numel() : sample_numel_;
  for (std::int64_t s = 0; s < samples; ++s) {
    const Tensor& x_f32 = staging_.read(x, s, n, kInSlot);
    kernels::gelu_forward(x_f32, staging_.write(y, s, n, kOutSlot));
    staging_.commit(kOutSlot);
  }
}

void GeluLayer::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  const bool f32 = x.dtype() == DType::f32 && dy.dtype() == DType::f32;
  const std::int64_t samples = f32 ? 1 : x.dim(0), n = f32 ? x.numel() : sample_numel_;
  for (std::int64_t s = 0; s < samples; ++s) {
    const Tensor& x_f32 = staging_.read(x, s, n, kInSlot);
    const Tensor& dy_f32 = staging_.read(dy, s, n, kDoutSlot);
    kernels::gelu_backward(x_f32, dy_f32, staging_.write(*dx, s, n, kDinSlot));
    staging_.commit(kDinSlot);
  }
}

}  // namespace mpt::nn
