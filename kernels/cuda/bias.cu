// CUDA bias add over the feature axis, forward and backward (see kernels/bias.hpp).
#include "kernels/bias.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {
namespace {
void check_shapes(const char* op, const Tensor& activation, const Tensor& bias) {
  require_cuda(op, "the activation must be f32 on the cuda device", activation, DType::f32);
  require_cuda(op, "the bias must be f32 on the cuda device", bias, DType::f32);
  detail::require(activation.rank() == 2, op, "the activation must be [batch, features]",
                  activation);
  detail::require(bias.rank() == 1, op, "the bias must be 1-D [features]", bias);
  detail::require_pair(activation.dim(1) == bias.dim(0), op,
                       "the activation's feature count must equal the bias length", activation,
                       bias);
}
}  // namespace

void bias_add_forward(Tensor& y, const Tensor& bias) {
  constexpr const char* op = "kernels::cuda::bias_add_forward";
  check_shapes(op, y, bias);
  const std::int64_t features = y.dim(1);
  float* out = y.data<float>();
  const float* b = bias.data<float>();
  launch_elementwise(op, y.numel(),
                     [=] __device__(std::int64_t i) { out[i] += b[i % features]; });
}

void bias_add_backward(const Tensor& dy, Tensor& dbias, bool accumulate) {
  constexpr const char* op = "kernels::cuda::bias_add_backward";
  check_shapes(op, dy, dbias);
  const std::int64_t batch = dy.dim(0), features = dy.dim(1);
  const float* grad_out = dy.data<float>();
  float* grad_bias = dbias.data<float>();
  // One thread per column walks the rows: neighbouring threads read neighbouring floats.
  launch_elementwise(op, features, [=] __device__(std::int64_t j) {
    float sum = accumulate ? grad_bias[j] : 0.f;
    for (std::int64_t row = 0; row < batch; ++row) sum += grad_out[row * features + j];
    grad_bias[j] = sum;
  });
}

}  // namespace mpt::kernels::cuda
