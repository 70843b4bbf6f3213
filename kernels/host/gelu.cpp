// Host GELU (see kernels/gelu.hpp): erf from libm in f32, which is what PyTorch's CPU kernel
// computes too, so the two agree to a few ulp.
#include "kernels/gelu.hpp"

#include <cmath>

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

void check(const char* op, const Tensor& a, const Tensor& b) {
  detail::require_host_f32(op, "tensors must be f32 on the host", a);
  detail::require_host_f32(op, "tensors must be f32 on the host", b);
  detail::require_pair(a.numel() == b.numel(), op, "tensors must have the same element count", a,
                       b);
}
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  static const std::string label = "kernels::gelu_forward";
  check("kernels::gelu_forward", x, y);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_chunks(label, x.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      out[i] = 0.5f * in[i] * (1.f + std::erf(in[i] * kInvSqrt2));
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::gelu_backward";
  check("kernels::gelu_backward", x, dy);
  check("kernels::gelu_backward", dy, dx);
  const float* in = x.data<float>();
  const float* grad_out = dy.data<float>();  // may alias dx
  float* grad_in = dx.data<float>();
  parallel_chunks(label, x.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float v = in[i];
      const float cdf = 0.5f * (1.f + std::erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      grad_in[i] = grad_out[i] * (cdf + v * pdf);
    }
  });
}

}  // namespace mpt::kernels::host
