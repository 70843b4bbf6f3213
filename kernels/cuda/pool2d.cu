// CUDA max and average pooling (see kernels/pool2d.hpp): the host's results bit for bit. One
// thread per output element forward; one per input element backward, gathering from the windows
// that cover it in the host's order, so there are no atomics and the sums are deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/pool2d.hpp"

namespace mpt::kernels::cuda {
namespace {

// The number of planes of X and Y, after checking that both hold whole planes of one count.
std::int64_t check_planes(const char* op, const Tensor& x, const Pool2dGeometry& g,
                          const Tensor& y) {
  require_cuda(op, "input must be f32 on the cuda device", x, DType::f32);
  require_cuda(op, "output must be f32 on the cuda device", y, DType::f32);
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height() * g.out_width();
  detail::require_pair(
      g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride >= 1 && g.kernel_h <= g.height &&
          g.kernel_w <= g.width && x.numel() % in_plane == 0 &&
          y.numel() == x.numel() / in_plane * out_plane,
      op, "tensors must hold the same number of whole input and output planes", x, y);
  return x.numel() / in_plane;
}

// The geometry as plain numbers, for the device lambdas (Pool2dGeometry's members are host-only).
struct Dims {
  std::int64_t height, width, kernel_h, kernel_w, stride, out_height, out_width;
};
Dims dims(const Pool2dGeometry& g) {
  return {g.height, g.width, g.kernel_h, g.kernel_w, g.stride, g.out_height(), g.out_width()};
}

// The first output row (or column) whose window covers input row (or column) AT: the smallest
// o with o * stride + kernel > at. Windows up to at / stride cover it, if they exist.
__device__ inline std::int64_t first_window(std::int64_t at, std::int64_t kernel,
                                            std::int64_t stride) {
  return at < kernel ? 0 : (at - kernel) / stride + 1;
}
__device__ inline std::int64_t last_window(std::int64_t at, std::int64_t stride,
                                           std::int64_t windows) {
  const std::int64_t last = at / stride;
  return last < windows - 1 ? last : windows - 1;
}

// The offset in the plane SRC of the first maximum of the window at CORNER, taps in row-major
// order: strict > keeps the first, and a NaN takes over unless one already has. The host
// backward's rule, so the gradient goes where the host sends it.
__device__ inline std::int64_t first_max_at(const float* src, std::int64_t corner, const Dims& d) {
  std::int64_t best_at = corner;
  float best = src[corner];
  for (std::int64_t i = 0; i < d.kernel_h; ++i)
    for (std::int64_t j = i == 0 ? 1 : 0; j < d.kernel_w; ++j) {
      const std::int64_t at = corner + i * d.width + j;
      const float v = src[at];
      if (v > best || (v != v && best == best)) {
        best = v;
        best_at = at;
      }
    }
  return best_at;
}

}  // namespace

void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  constexpr const char* op = "kernels::cuda::max_pool2d_forward";
  const std::int64_t planes = check_planes(op, x, g, y);
  const Dims d = dims(g);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const std::int64_t out_plane = d.out_height * d.out_width;
  launch_elementwise(op, planes * out_plane, [=] __device__(std::int64_t o) {
    const std::int64_t p = o / out_plane, oh = o % out_plane / d.out_width, ow = o % d.out_width;
    const float* window = in + p * d.height * d.width + oh * d.stride * d.width + ow * d.stride;
    float best = window[0];
    for (std::int64_t i = 0; i < d.kernel_h; ++i)
      for (std::int64_t j = i == 0 ? 1 : 0; j < d.kernel_w; ++j) {
        const float v = window[i * d.width + j];
        best = v > best || v != v ? v : best;  // the host forward's rule: every NaN takes over
      }
    out[o] = best;
  });
}

void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::max_pool2d_backward";
  const std::int64_t planes = check_planes(op, x, g, dy);
  require_cuda(op, "dx must be f32 on the cuda device", dx, DType::f32);
  detail::require_pair(dx.numel() == x.numel(), op, "dx must be f32 shaped like x", x, dx);
  const Dims d = dims(g);
  const float* in = x.data<float>();
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  const std::int64_t plane = d.height * d.width, out_plane = d.out_height * d.out_width;
  // Windows that tile without overlap: the host writes the gradient's bits (a -0 stays -0);
  // otherwise it adds the gradients to a +0, window by window in row-major order, as here.
  const bool disjoint = d.stride == d.kernel_h && d.stride == d.kernel_w;
  launch_elementwise(op, planes * plane, [=] __device__(std::int64_t e) {
    const std::int64_t p = e / plane, at = e % plane, h = at / d.width, w = at % d.width;
    const float* src = in + p * plane;
    const float* grad = grad_out + p * out_plane;
    const std::int64_t oh_end = last_window(h, d.stride, d.out_height) + 1;
    const std::int64_t ow_end = last_window(w, d.stride, d.out_width) + 1;
    float sum = 0.f;
    for (std::int64_t oh = first_window(h, d.kernel_h, d.stride); oh < oh_end; ++oh)
      for (std::int64_t ow = first_window(w, d.kernel_w, d.stride); ow < ow_end; ++ow)
        if (first_max_at(src, oh * d.stride * d.width + ow * d.stride, d) == at) {
          const float share = grad[oh * d.out_width + ow];
          sum = disjoint ? share : __fadd_rn(sum, share);
        }
    grad_in[e] = sum;
  });
}

void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  constexpr const char* op = "kernels::cuda::avg_pool2d_forward";
  const std::int64_t planes = check_planes(op, x, g, y);
  const Dims d = dims(g);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const std::int64_t out_plane = d.out_height * d.out_width;
  const float scale = 1.f / static_cast<float>(g.kernel_h * g.kernel_w);  // as the host
  launch_elementwise(op, planes * out_plane, [=] __device__(std::int64_t o) {
    const std::int64_t p = o / out_plane, oh = o % out_plane / d.out_width, ow = o % d.out_width;
    const float* window = in + p * d.height * d.width + oh * d.stride * d.width + ow * d.stride;
    float sum = 0.f;  // in the host's order, taps row by row
    for (std::int64_t i = 0; i < d.kernel_h; ++i)
      for (std::int64_t j = 0; j < d.kernel_w; ++j) sum = __fadd_rn(sum, window[i * d.width + j]);
    out[o] = __fmul_rn(sum, scale);
  });
}

void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::avg_pool2d_backward";
  const std::int64_t planes = check_planes(op, dx, g, dy);
  const Dims d = dims(g);
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  const std::int64_t plane = d.height * d.width, out_plane = d.out_height * d.out_width;
  const float scale = 1.f / static_cast<float>(g.kernel_h * g.kernel_w);  // as the host
  launch_elementwise(op, planes * plane, [=] __device__(std::int64_t e) {
    const std::int64_t p = e / plane, at = e % plane, h = at / d.width, w = at % d.width;
    const float* grad = grad_out + p * out_plane;
    const std::int64_t oh_end = last_window(h, d.stride, d.out_height) + 1;
    const std::int64_t ow_end = last_window(w, d.stride, d.out_width) + 1;
    // The host adds grad * scale to a +0, window by window in row-major order. The explicit
    // roundings keep nvcc from contracting the two into an FMA, which the host does not do.
    float sum = 0.f;
    for (std::int64_t oh = first_window(h, d.kernel_h, d.stride); oh < oh_end; ++oh)
      for (std::int64_t ow = first_window(w, d.kernel_w, d.stride); ow < ow_end; ++ow)
        sum = __fadd_rn(sum, __fmul_rn(grad[oh * d.out_width + ow], scale));
    grad_in[e] = sum;
  });
}

}  // namespace mpt::kernels::cuda
