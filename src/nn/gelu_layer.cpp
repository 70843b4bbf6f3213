// GELU layer: the whole batch in one kernel call under f32, runs of samples through f32 staging
// under 16-bit storage (one sample on the host). The backward needs the forward's input X, not
// its output.
#include "nn/gelu_layer.hpp"

#include <algorithm>

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

void GeluLayer::plan(std::int64_t max_batch, DType precision) {
  run_ = SampleStaging::run_samples(device_, sample_numel_, max_batch);
  const std::int64_t n = run_ * sample_numel_;
  staging_.plan(precision, device_, {n, n, n, n});
}

void GeluLayer::forward(const Tensor& x, Tensor& y, bool) {
  const bool f32 = x.dtype() == DType::f32 && y.dtype() == DType::f32;
  const std::int64_t batch = x.dim(0), run = f32 ? std::max<std::int64_t>(1, batch) : run_;
  const std::int64_t n = sample_numel_;
  for (std::int64_t first = 0; first < batch; first += run) {
    const std::int64_t count = std::min(run, batch - first);
    const Tensor& x_f32 = staging_.read_run(x, first, count, n, kInSlot);
    kernels::gelu_forward(x_f32, staging_.write_run(y, first, count, n, kOutSlot));
    staging_.commit(kOutSlot);
  }
}

void GeluLayer::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  const bool f32 = x.dtype() == DType::f32 && dy.dtype() == DType::f32;
  const std::int64_t batch = x.dim(0), run = f32 ? std::max<std::int64_t>(1, batch) : run_;
  const std::int64_t n = sample_numel_;
  for (std::int64_t first = 0; first < batch; first += run) {
    const std::int64_t count = std::min(run, batch - first);
    const Tensor& x_f32 = staging_.read_run(x, first, count, n, kInSlot);
    const Tensor& dy_f32 = staging_.read_run(dy, first, count, n, kDoutSlot);
    kernels::gelu_backward(x_f32, dy_f32, staging_.write_run(*dx, first, count, n, kDinSlot));
    staging_.commit(kDinSlot);
  }
}

}  // namespace mpt::nn
