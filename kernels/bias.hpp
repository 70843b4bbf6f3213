// Bias add over the feature axis of a [batch, features] activation, forward and backward.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void bias_add_forward(Tensor& y, const Tensor& bias);
void bias_add_backward(const Tensor& dy, Tensor& dbias, bool accumulate);
}  // namespace host
// The CUDA twins (kernels/cuda/bias.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void bias_add_forward(Tensor& y, const Tensor& bias);
void bias_add_backward(const Tensor& dy, Tensor& dbias, bool accumulate);
}  // namespace cuda

// y[b, n] += bias[n], in place. y is [B, N] f32, bias is [N] f32.
inline void bias_add_forward(Tensor& y, const Tensor& bias) {
  detail::require_disjoint("kernels::bias_add_forward", "y must not overlap bias", bias, y);
  MPT_DISPATCH_CUDA(y, bias_add_forward, y, bias);
  host::bias_add_forward(y, bias);
}

// dbias[n] = sum over b of dy[b, n]; overwrites dbias, or adds to it with ACCUMULATE (for a
// batch processed in blocks of rows). dy is [B, N] f32.
inline void bias_add_backward(const Tensor& dy, Tensor& dbias, bool accumulate = false) {
  detail::require_disjoint("kernels::bias_add_backward", "dbias must not overlap dy", dy, dbias);
  MPT_DISPATCH_CUDA(dy, bias_add_backward, dy, dbias, accumulate);
  host::bias_add_backward(dy, dbias, accumulate);
}

}  // namespace mpt::kernels
