// CUDA GELU in the exact erf form (see kernels/gelu.hpp); erff/expf agree with libm to a few ulp.
#include "kernels/cuda/common.cuh"
#include "kernels/gelu.hpp"

namespace mpt::kernels::cuda {
namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

void check(const char* op, const Tensor& a, const Tensor& b) {
  require_cuda(op, "tensors must be f32 on the cuda device", a, DType::f32);
  require_cuda(op, "tensors must be f32 on the cuda device", b, DType::f32);
  detail::require_pair(a.numel() == b.numel(), op, "tensors must have the same element count", a, b);
}
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "kernels::cuda::gelu_forward";
  check(op, x, y);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) {
    const float v = in[i];
    out[i] = 0.5f * v * (1.f + erff(v * kInvSqrt2));
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::gelu_backward";
  check(op, x, dy);
  check(op, dy, dx);
  const float* in = x.data<float>();
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) {
    const float v = in[i];
    const float cdf = 0.5f * (1.f + erff(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    grad_in[i] = grad_out[i] * (cdf + v * pdf);
  });
}

}  // namespace mpt::kernels::cuda
