// Host bias add, forward and backward (see kernels/bias.hpp).
#include "kernels/bias.hpp"

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {
void check_shapes(const char* op, const Tensor& activation, const Tensor& bias) {
  detail::require_host_f32(op, "the activation must be f32 on the host", activation);
  detail::require_host_f32(op, "the bias must be f32 on the host", bias);
  detail::require(activation.rank() == 2, op, "the activation must be [batch, features]",
                  activation);
  detail::require(bias.rank() == 1, op, "the bias must be 1-D [features]", bias);
  detail::require_pair(activation.dim(1) == bias.dim(0), op,
                       "the activation's feature count must equal the bias length", activation,
                       bias);
}
}  // namespace

void bias_add_forward(Tensor& y, const Tensor& bias) {
  static const std::string label = "kernels::bias_add_forward";
  check_shapes("kernels::bias_add_forward", y, bias);
  const std::int64_t features = y.dim(1);
  float* __restrict out = y.data<float>();
  const float* __restrict b = bias.data<float>();
  parallel_rows(label, y.dim(0), features, [=](std::int64_t row_begin, std::int64_t row_end) {
    for (std::int64_t row = row_begin; row < row_end; ++row) {
      float* __restrict out_row = out + row * features;
      for (std::int64_t j = 0; j < features; ++j) out_row[j] += b[j];
    }
  });
}

void bias_add_backward(const Tensor& dy, Tensor& dbias, bool accumulate) {
  static const std::string label = "kernels::bias_add_backward";
  check_shapes("kernels::bias_add_backward", dy, dbias);
  const std::int64_t batch = dy.dim(0), features = dy.dim(1);
  const float* __restrict grad_out = dy.data<float>();
  float* __restrict grad_bias = dbias.data<float>();
  // Parallel over blocks of columns; each block walks all rows, adding a row segment into a
  // block of sums that stays in L1, so the inner loop is a contiguous, vectorised add.
  constexpr std::int64_t kColumnsPerBlock = 256;
  const std::int64_t blocks = (features + kColumnsPerBlock - 1) / kColumnsPerBlock;
  parallel_for(label, blocks, [=](const std::int64_t block) {
    const std::int64_t begin = block * kColumnsPerBlock;
    const std::int64_t end = std::min(features, begin + kColumnsPerBlock);
    if (!accumulate)
      for (std::int64_t j = begin; j < end; ++j) grad_bias[j] = 0.f;
    for (std::int64_t row = 0; row < batch; ++row) {
      const float* __restrict grad_row = grad_out + row * features;
      for (std::int64_t j = begin; j < end; ++j) grad_bias[j] += grad_row[j];
    }
  });
}

}  // namespace mpt::kernels::host
