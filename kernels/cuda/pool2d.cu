// CUDA max and average pooling (see kernels/pool2d.hpp): the host's results bit for bit, max
// pooling on f32, f16 or bf16 storage. One
// thread per output element forward; one per input element backward, gathering from the windows
// that cover it in the host's order, so there are no atomics and the sums are deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/pool2d.hpp"

namespace mpt::kernels::cuda {
namespace {

// The number of planes of X and Y, after checking that both hold whole planes of one count.
std::int64_t plane_count(const char* op, const Tensor& x, const Pool2dGeometry& g,
                         const Tensor& y) {
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height() * g.out_width();
  detail::require_pair(
      g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride >= 1 && g.kernel_h <= g.height &&
          g.kernel_w <= g.width && x.numel() % in_plane == 0 &&
          y.numel() == x.numel() / in_plane * out_plane,
      op, "tensors must hold the same number of whole input and output planes", x, y);
  return x.numel() / in_plane;
}
std::int64_t check_planes(const char* op, const Tensor& x, const Pool2dGeometry& g,
                          const Tensor& y) {
  require_cuda(op, "input must be f32 on the cuda device", x, DType::f32);
  require_cuda(op, "output must be f32 on the cuda device", y, DType::f32);
  return plane_count(op, x, g, y);
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

// Max pooling's order on each storage dtype, the host's (kernels/host/pool2d.cpp): a key
// ordered as the values are (on 16-bit storage the signed magnitude, so -0 and +0 tie, with
// every NaN above every number), the forward's rule (a larger value or any NaN takes over)
// and the backward's (a larger value, or a NaN when none came before).
struct F32Order {
  using Bits = float;
  __device__ static float key(float v) { return v; }
  __device__ static bool forward_takes(float k, float best) { return k > best || k != k; }
  __device__ static bool backward_takes(float k, float best) {
    return k > best || (k != k && best == best);
  }
};
template <int kInf>  // the magnitude bits of infinity
struct HalfOrder {
  using Bits = std::uint16_t;
  static constexpr int kNaN = 0x8000;
  __device__ static int key(std::uint16_t b) {
    const int magnitude = b & 0x7fff;
    return magnitude > kInf ? kNaN : (b & 0x8000) ? -magnitude : magnitude;
  }
  __device__ static bool forward_takes(int k, int best) { return k > best || k == kNaN; }
  __device__ static bool backward_takes(int k, int best) { return k > best; }
};

// The offset in the plane SRC of the first maximum of the window at CORNER, taps in row-major
// order, by the backward's rule: the gradient goes where the host sends it.
template <class Order>
__device__ inline std::int64_t first_max_at(const typename Order::Bits* src, std::int64_t corner,
                                            const Dims& d) {
  std::int64_t best_at = corner;
  auto best = Order::key(src[corner]);
  for (std::int64_t i = 0; i < d.kernel_h; ++i)
    for (std::int64_t j = i == 0 ? 1 : 0; j < d.kernel_w; ++j) {
      const std::int64_t at = corner + i * d.width + j;
      const auto k = Order::key(src[at]);
      if (Order::backward_takes(k, best)) {
        best = k;
        best_at = at;
      }
    }
  return best_at;
}

// A gradient routed to an input element: the share itself where windows are disjoint (its bits,
// so a -0 stays -0), else added in f32. 16-bit storage is disjoint only.
__device__ inline float gather(float sum, float share, bool disjoint) {
  return disjoint ? share : __fadd_rn(sum, share);
}
__device__ inline std::uint16_t gather(std::uint16_t, std::uint16_t share, bool) { return share; }

template <class Order>
void max_forward(const char* op, const Tensor& x, const Dims& d, std::int64_t planes, Tensor& y) {
  using Bits = typename Order::Bits;
  const auto* in = static_cast<const Bits*>(x.raw());
  auto* out = static_cast<Bits*>(y.raw());
  const std::int64_t out_plane = d.out_height * d.out_width;
  launch_elementwise(op, planes * out_plane, [=] __device__(std::int64_t o) {
    const std::int64_t p = o / out_plane, oh = o % out_plane / d.out_width, ow = o % d.out_width;
    const Bits* window = in + p * d.height * d.width + oh * d.stride * d.width + ow * d.stride;
    Bits best = window[0];
    auto best_key = Order::key(best);
    for (std::int64_t i = 0; i < d.kernel_h; ++i)
      for (std::int64_t j = i == 0 ? 1 : 0; j < d.kernel_w; ++j) {
        const Bits v = window[i * d.width + j];
        const auto k = Order::key(v);
        if (Order::forward_takes(k, best_key)) {  // every NaN takes over
          best = v;
          best_key = k;
        }
      }
    out[o] = best;
  });
}

template <class Order>
void max_backward(const char* op, const Tensor& x, const Dims& d, std::int64_t planes,
                  const Tensor& dy, Tensor& dx) {
  using Bits = typename Order::Bits;
  const auto* in = static_cast<const Bits*>(x.raw());
  const auto* grad_out = static_cast<const Bits*>(dy.raw());
  auto* grad_in = static_cast<Bits*>(dx.raw());
  const std::int64_t plane = d.height * d.width, out_plane = d.out_height * d.out_width;
  // Windows that tile without overlap: the host writes the gradient's bits (a -0 stays -0);
  // otherwise (f32 only) it adds the gradients to a +0, window by window in row-major order,
  // as here.
  const bool disjoint = d.stride == d.kernel_h && d.stride == d.kernel_w;
  launch_elementwise(op, planes * plane, [=] __device__(std::int64_t e) {
    const std::int64_t p = e / plane, at = e % plane, h = at / d.width, w = at % d.width;
    const Bits* src = in + p * plane;
    const Bits* grad = grad_out + p * out_plane;
    const std::int64_t oh_end = last_window(h, d.stride, d.out_height) + 1;
    const std::int64_t ow_end = last_window(w, d.stride, d.out_width) + 1;
    Bits sum{};
    for (std::int64_t oh = first_window(h, d.kernel_h, d.stride); oh < oh_end; ++oh)
      for (std::int64_t ow = first_window(w, d.kernel_w, d.stride); ow < ow_end; ++ow)
        if (first_max_at<Order>(src, oh * d.stride * d.width + ow * d.stride, d) == at)
          sum = gather(sum, grad[oh * d.out_width + ow], disjoint);
    grad_in[e] = sum;
  });
}

// A max-pool operand: f32, f16 or bf16 on the cuda device, in DTYPE.
void require_pool_operand(const char* op, const char* what, const Tensor& t, DType dtype) {
  detail::require(
      t.defined() && t.device() == Device::cuda && t.dtype() == dtype && is_float_dtype(dtype), op,
      what, t);
}

}  // namespace

void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  constexpr const char* op = "kernels::cuda::max_pool2d_forward";
  require_pool_operand(op, "input must be f32, f16 or bf16 on the cuda device", x, x.dtype());
  require_pool_operand(op, "output must be on the cuda device in the input's dtype", y, x.dtype());
  const std::int64_t planes = plane_count(op, x, g, y);
  const Dims d = dims(g);
  switch (x.dtype()) {
    case DType::f16:
      return max_forward<HalfOrder<0x7c00>>(op, x, d, planes, y);
    case DType::bf16:
      return max_forward<HalfOrder<0x7f80>>(op, x, d, planes, y);
    default:
      return max_forward<F32Order>(op, x, d, planes, y);
  }
}

void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::max_pool2d_backward";
  require_pool_operand(op, "input must be f32, f16 or bf16 on the cuda device", x, x.dtype());
  require_pool_operand(op, "dy must be on the cuda device in x's dtype", dy, x.dtype());
  const std::int64_t planes = plane_count(op, x, g, dy);
  detail::require_pair(dx.defined() && dx.dtype() == x.dtype() && dx.device() == Device::cuda &&
                           dx.numel() == x.numel(),
                       op, "dx must be on the cuda device shaped like x, in its dtype", x, dx);
  const bool disjoint = g.stride == g.kernel_h && g.stride == g.kernel_w;
  detail::require(x.dtype() == DType::f32 || disjoint, op,
                  "16-bit max pooling's backward needs disjoint windows (stride == kernel)", x);
  const Dims d = dims(g);
  switch (x.dtype()) {
    case DType::f16:
      return max_backward<HalfOrder<0x7c00>>(op, x, d, planes, dy, dx);
    case DType::bf16:
      return max_backward<HalfOrder<0x7f80>>(op, x, d, planes, dy, dx);
    default:
      return max_backward<F32Order>(op, x, d, planes, dy, dx);
  }
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
