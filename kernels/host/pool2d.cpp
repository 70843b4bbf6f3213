// Host max and average pooling (see kernels/pool2d.hpp). One task per block of planes: the
// windows of a plane may overlap in the backward pass, those of two planes never do.
#include "kernels/pool2d.hpp"

#include <cmath>

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {

// The number of planes of X and Y, after checking that both hold whole planes of one count.
std::int64_t check_planes(const char* op, const Tensor& x, const Pool2dGeometry& g,
                          const Tensor& y) {
  detail::require_host_f32(op, "input must be f32 on the host", x);
  detail::require_host_f32(op, "output must be f32 on the host", y);
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height() * g.out_width();
  detail::require_pair(
      g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride >= 1 && g.kernel_h <= g.height &&
          g.kernel_w <= g.width && x.numel() % in_plane == 0 &&
          y.numel() == x.numel() / in_plane * out_plane,
      op, "tensors must hold the same number of whole input and output planes", x, y);
  return x.numel() / in_plane;
}

}  // namespace

void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  static const std::string label = "kernels::max_pool2d_forward";
  const std::int64_t planes = check_planes("kernels::max_pool2d_forward", x, g, y);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  parallel_rows(label, planes, g.height * g.width, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      const float* src = in + p * g.height * g.width;
      float* dst = out + p * oh_n * ow_n;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const float* window = src + oh * g.stride * g.width + ow * g.stride;
          float best = window[0];
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) {
              const float v = window[i * g.width + j];
              if (v > best || std::isnan(v)) best = v;
              if (std::isnan(best)) break;
            }
          dst[oh * ow_n + ow] = best;
        }
    }
  });
}

void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::max_pool2d_backward";
  const std::int64_t planes = check_planes("kernels::max_pool2d_backward", x, g, dy);
  detail::require_pair(dx.defined() && dx.dtype() == DType::f32 && dx.numel() == x.numel(),
                       "kernels::max_pool2d_backward", "dx must be f32 shaped like x", x, dx);
  const float* in = x.data<float>();
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = g.height * g.width;
  parallel_rows(label, planes, plane, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      const float* src = in + p * plane;
      float* dst = grad_in + p * plane;
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          // The same scan as the forward, so the routed position is the forward's maximum.
          const std::int64_t corner = oh * g.stride * g.width + ow * g.stride;
          std::int64_t best = corner;
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) {
              const std::int64_t at = corner + i * g.width + j;
              if (src[at] > src[best] || (std::isnan(src[at]) && !std::isnan(src[best]))) best = at;
            }
          dst[best] += grad_out[p * oh_n * ow_n + oh * ow_n + ow];
        }
    }
  });
}

void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  static const std::string label = "kernels::avg_pool2d_forward";
  const std::int64_t planes = check_planes("kernels::avg_pool2d_forward", x, g, y);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  const float scale = 1.f / static_cast<float>(g.kernel_h * g.kernel_w);
  parallel_rows(label, planes, g.height * g.width, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      const float* src = in + p * g.height * g.width;
      float* dst = out + p * oh_n * ow_n;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const float* window = src + oh * g.stride * g.width + ow * g.stride;
          float sum = 0.f;
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) sum += window[i * g.width + j];
          dst[oh * ow_n + ow] = sum * scale;
        }
    }
  });
}

void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::avg_pool2d_backward";
  const std::int64_t planes = check_planes("kernels::avg_pool2d_backward", dx, g, dy);
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = g.height * g.width;
  const float scale = 1.f / static_cast<float>(g.kernel_h * g.kernel_w);
  parallel_rows(label, planes, plane, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      float* dst = grad_in + p * plane;
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const float share = grad_out[p * oh_n * ow_n + oh * ow_n + ow] * scale;
          float* window = dst + oh * g.stride * g.width + ow * g.stride;
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) window[i * g.width + j] += share;
        }
    }
  });
}

}  // namespace mpt::kernels::host
