// 2-D max and average pooling over NCHW f32 batches, forward and backward; global average
// pooling is average pooling with the window set to the whole plane.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// Planes of HEIGHT x WIDTH, windows of KERNEL_H x KERNEL_W every STRIDE, no padding; windows
// that would run past the edge are dropped (PyTorch's ceil_mode=False).
struct Pool2dGeometry {
  std::int64_t height = 0, width = 0, kernel_h = 1, kernel_w = 1, stride = 1;
  std::int64_t out_height() const { return (height - kernel_h) / stride + 1; }
  std::int64_t out_width() const { return (width - kernel_w) / stride + 1; }
};

namespace host {
void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y);
void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx);
void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y);
void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx);
}  // namespace host
// The CUDA twins (kernels/cuda/pool2d.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y);
void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx);
void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y);
void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx);
}  // namespace cuda

// Y = the maximum of each window, for X f32 holding whole planes (any batch x channels) and Y
// holding as many output planes. A NaN in a window wins, so loss scaling sees it.
inline void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  MPT_DISPATCH_CUDA(x, max_pool2d_forward, x, g, y);
  host::max_pool2d_forward(x, g, y);
}

// DX = DY routed to the first maximum of each window of X (recomputed, so no index buffer is
// kept), summed where windows overlap. Overwrites DX.
inline void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy,
                                Tensor& dx) {
  MPT_DISPATCH_CUDA(x, max_pool2d_backward, x, g, dy, dx);
  host::max_pool2d_backward(x, g, dy, dx);
}

// Y = the mean of each window.
inline void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  MPT_DISPATCH_CUDA(x, avg_pool2d_forward, x, g, y);
  host::avg_pool2d_forward(x, g, y);
}

// DX = DY / window size spread over each window, summed where windows overlap. Overwrites DX.
inline void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  MPT_DISPATCH_CUDA(dy, avg_pool2d_backward, g, dy, dx);
  host::avg_pool2d_backward(g, dy, dx);
}

}  // namespace mpt::kernels
