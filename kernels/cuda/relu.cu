// CUDA ReLU (see kernels/relu.hpp): the host's rules, including the bit tests on 16-bit storage.
#include "kernels/cuda/common.cuh"
#include "kernels/relu.hpp"

namespace mpt::kernels::cuda {
namespace {
void check(const char* op, const char* what, const Tensor& t, DType dtype) {
  detail::require(t.defined() && t.device() == Device::cuda && t.dtype() == dtype &&
                      is_float_dtype(dtype),
                  op, what, t);
}
}  // namespace

void relu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "kernels::cuda::relu_forward";
  check(op, "x must be f32, f16 or bf16 on the cuda device", x, x.dtype());
  check(op, "y must have x's dtype", y, x.dtype());
  detail::require_pair(x.numel() == y.numel(), op, "x and y must have the same number of elements",
                       x, y);
  if (x.dtype() != DType::f32) {
    const auto* in = static_cast<const std::uint16_t*>(x.raw());
    auto* out = static_cast<std::uint16_t*>(y.raw());
    const std::uint16_t inf = x.dtype() == DType::f16 ? 0x7c00u : 0x7f80u;
    launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) {
      const std::uint16_t bits = in[i];
      out[i] = static_cast<std::uint16_t>(bits - 0x8001u) < inf ? std::uint16_t{0} : bits;
    });
    return;
  }
  const float* in = x.data<float>();
  float* out = y.data<float>();
  launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) {
    const float v = in[i];
    out[i] = v < 0.f ? 0.f : v;  // NaN stays NaN
  });
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::relu_backward";
  check(op, "y must be f32, f16 or bf16 on the cuda device", y, y.dtype());
  check(op, "dy must have y's dtype", dy, y.dtype());
  check(op, "dx must have y's dtype", dx, y.dtype());
  detail::require_pair(y.numel() == dy.numel(), op,
                       "y and dy must have the same number of elements", y, dy);
  detail::require_pair(dy.numel() == dx.numel(), op,
                       "dy and dx must have the same number of elements", dy, dx);
  if (y.dtype() != DType::f32) {
    const auto* out = static_cast<const std::uint16_t*>(y.raw());
    const auto* grad_out = static_cast<const std::uint16_t*>(dy.raw());
    auto* grad_in = static_cast<std::uint16_t*>(dx.raw());
    const std::uint16_t inf = y.dtype() == DType::f16 ? 0x7c00u : 0x7f80u;
    launch_elementwise(op, y.numel(), [=] __device__(std::int64_t i) {
      const std::uint16_t g = grad_out[i];
      grad_in[i] = static_cast<std::uint16_t>(out[i] - 1u) < inf ? g : std::uint16_t{0};
    });
    return;
  }
  const float* out = y.data<float>();
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  launch_elementwise(op, y.numel(), [=] __device__(std::int64_t i) {
    const float g = grad_out[i];
    grad_in[i] = out[i] > 0.f ? g : 0.f;
  });
}

}  // namespace mpt::kernels::cuda
