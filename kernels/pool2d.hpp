// 2-D max and average pooling over NCHW batches, forward and backward; global average pooling
// is average pooling with the window set to the whole plane. Max pooling runs on f32, f16 or
// bf16 storage (it only selects, so the 16-bit results are the f32 results' bits); average
// pooling on f32.
#pragma once

#include <cstdint>
#include <memory>

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

// The instruction set of 16-bit maxpool:2 (2x2 windows every 2), the hot case, which has its
// own clones: AVX-512 (F, BW, VL) with masked row tails, AVX2, and a baseline. Chosen once from
// the CPU; limit_pool_isa caps it, so that tests and benchmarks reach every clone.
enum class PoolIsa : std::uint8_t { baseline, avx2, avx512 };
PoolIsa pool_isa();
void limit_pool_isa(PoolIsa limit);
}  // namespace host
// The CUDA twins (kernels/cuda/pool2d.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y);
void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx);
void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y);
void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx);

// Max or average pooling through cuDNN (kernels/cuda/pool2d_cudnn.cu, built where cuDNN is:
// MPTRAIN_HAVE_CUDNN), forward and backward, x and y in one dtype (f32, f16 or bf16; FP32
// compute). Max pooling is CUDNN_POOLING_MAX_DETERMINISTIC with NaN propagation (a NaN wins,
// as on the host); where a window holds equal maxima its gradient may go to another of them
// than the host's first (docs/gpu.md). Descriptors are made once per batch size.
class CudnnPool2d {
 public:
  CudnnPool2d();
  ~CudnnPool2d();
  CudnnPool2d(CudnnPool2d&&) noexcept;
  CudnnPool2d& operator=(CudnnPool2d&&) noexcept;

  // Samples of CHANNELS planes of G, in DTYPE; MAX or average.
  void plan(const Pool2dGeometry& g, std::int64_t channels, DType dtype, bool max);
  bool planned() const;
  // Y [n, C, OH, OW] from X [n, C, H, W], both in the planned dtype on the cuda device.
  void forward(const Tensor& x, Tensor& y);
  // DX from DY, with X and Y of the forward (max pooling finds the maxima again). Overwrites DX.
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

 private:
  struct State;
  std::unique_ptr<State> state_;
};
}  // namespace cuda

// Y = the maximum of each window, for X holding whole planes (any batch x channels) and Y
// holding as many output planes, both in one dtype: f32, f16 or bf16. A NaN in a window wins
// (the last in row-major order), so loss scaling sees it; of equal maxima the first wins.
inline void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  detail::require_disjoint("kernels::max_pool2d_forward", "y must not overlap x", x, y);
  MPT_DISPATCH_CUDA(x, max_pool2d_forward, x, g, y);
  host::max_pool2d_forward(x, g, y);
}

// DX = DY routed to the first maximum of each window of X (recomputed, so no index buffer is
// kept; a NaN takes it from the numbers, the first NaN from later ones), summed where windows
// overlap. Overwrites DX. X, DY and DX share one dtype; 16-bit storage needs disjoint windows
// (stride == kernel), where every element gets one gradient or 0 and nothing is added.
inline void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy,
                                Tensor& dx) {
  detail::require_disjoint("kernels::max_pool2d_backward", "dx must not overlap x", x, dx);
  detail::require_disjoint("kernels::max_pool2d_backward", "dx must not overlap dy", dy, dx);
  MPT_DISPATCH_CUDA(x, max_pool2d_backward, x, g, dy, dx);
  host::max_pool2d_backward(x, g, dy, dx);
}

// Y = the mean of each window.
inline void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  detail::require_disjoint("kernels::avg_pool2d_forward", "y must not overlap x", x, y);
  MPT_DISPATCH_CUDA(x, avg_pool2d_forward, x, g, y);
  host::avg_pool2d_forward(x, g, y);
}

// DX = DY / window size spread over each window, summed where windows overlap. Overwrites DX.
inline void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  detail::require_disjoint("kernels::avg_pool2d_backward", "dx must not overlap dy", dy, dx);
  MPT_DISPATCH_CUDA(dy, avg_pool2d_backward, g, dy, dx);
  host::avg_pool2d_backward(g, dy, dx);
}

}  // namespace mpt::kernels
