// Host ReLU forward and backward (see kernels/relu.hpp).
#include "kernels/relu.hpp"

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

void relu_forward(const Tensor& x, Tensor& y) {
  static const std::string label = "kernels::relu_forward";
  detail::require_host_f32("kernels::relu_forward", "x must be f32 on the host", x);
  detail::require_host_f32("kernels::relu_forward", "y must be f32 on the host", y);
  detail::require_pair(x.numel() == y.numel(), "kernels::relu_forward",
                       "x and y must have the same number of elements", x, y);
  // No __restrict: x and y may alias (in-place ReLU); an elementwise loop is safe either way.
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_chunks(label, x.numel(), [=](std::int64_t begin, std::int64_t end) {
    // "x < 0 ? 0 : x" rather than max(x, 0): a NaN stays NaN, like PyTorch's relu.
    for (std::int64_t i = begin; i < end; ++i) out[i] = in[i] < 0.f ? 0.f : in[i];
  });
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::relu_backward";
  detail::require_host_f32("kernels::relu_backward", "y must be f32 on the host", y);
  detail::require_host_f32("kernels::relu_backward", "dy must be f32 on the host", dy);
  detail::require_host_f32("kernels::relu_backward", "dx must be f32 on the host", dx);
  detail::require_pair(y.numel() == dy.numel(), "kernels::relu_backward",
                       "y and dy must have the same number of elements", y, dy);
  detail::require_pair(dy.numel() == dx.numel(), "kernels::relu_backward",
                       "dy and dx must have the same number of elements", dy, dx);
  const float* __restrict out = y.data<float>();
  const float* grad_out = dy.data<float>();  // may alias dx
  float* grad_in = dx.data<float>();
  parallel_chunks(label, y.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      // Load unconditionally: a load under the condition would block if-conversion to a blend.
      const float g = grad_out[i];
      grad_in[i] = out[i] > 0.f ? g : 0.f;
    }
  });
}

}  // namespace mpt::kernels::host
