// The pieces of a 2-D convolution lowered to matmul (im2col + GEMM): unfolding one sample's
// windows into columns, folding column gradients back, and the per-channel bias.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// One NCHW sample of CHANNELS x HEIGHT x WIDTH under a square KERNEL, STRIDE and zero PAD
// (dilation 1): the windows lie at out_height() x out_width() positions.
struct Conv2dGeometry {
  std::int64_t channels = 0, height = 0, width = 0, kernel = 1, stride = 1, pad = 0;
  std::int64_t out_height() const { return (height + 2 * pad - kernel) / stride + 1; }
  std::int64_t out_width() const { return (width + 2 * pad - kernel) / stride + 1; }
  std::int64_t col_rows() const { return channels * kernel * kernel; }
  std::int64_t col_columns() const { return out_height() * out_width(); }
};

namespace host {
void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col);
void col2im(const Tensor& col, const Conv2dGeometry& g, Tensor& dx);
void channel_bias_forward(Tensor& y, const Tensor& bias);
void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate);
}  // namespace host

// COL[c*K*K + i*K + j, oh*OW + ow] = X[c, oh*S - P + i, ow*S - P + j] (0 outside X) for one f32
// sample X of G's shape; COL is f32 [col_rows, col_columns], caller-owned.
inline void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col) {
  if (x.device() != Device::cpu) detail::built_without_cuda("kernels::im2col");
  host::im2col(x, g, col);
}

// The adjoint of im2col: DX (one f32 sample) = the sum of COL's entries over the windows that
// read each input element. Overwrites DX.
inline void col2im(const Tensor& col, const Conv2dGeometry& g, Tensor& dx) {
  if (col.device() != Device::cpu) detail::built_without_cuda("kernels::col2im");
  host::col2im(col, g, dx);
}

// Y[c, p] += BIAS[c] for f32 Y [C, P] (channels first, as a conv output sample is).
inline void channel_bias_forward(Tensor& y, const Tensor& bias) {
  if (y.device() != Device::cpu) detail::built_without_cuda("kernels::channel_bias_forward");
  host::channel_bias_forward(y, bias);
}

// BIAS_GRAD[c] (+)= sum over p of DY[c, p]; overwrites unless ACCUMULATE.
inline void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate) {
  if (dy.device() != Device::cpu) detail::built_without_cuda("kernels::channel_bias_backward");
  host::channel_bias_backward(dy, bias_grad, accumulate);
}

}  // namespace mpt::kernels
