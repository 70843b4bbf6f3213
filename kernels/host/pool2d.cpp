// Host max and average pooling (see kernels/pool2d.hpp). One task per block of planes: the
// windows of a plane may overlap in the backward pass, those of two planes never do.
#include "kernels/pool2d.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/host/parallel.hpp"

// The zero fills here cover a column or two per row; GCC would make each a memset call, which
// costs more than the stores (see kernels/host/conv2d.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

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

// Takes V as the running maximum (and TAP as where it came from) when V is larger, or V is a
// NaN and no NaN came before: the forward's choice, so the same input gets the gradient.
// Bitwise, not short-circuit, so the loops that call it have no branch and vectorise.
inline void take_larger(float v, std::uint32_t tap, float& best, std::uint32_t& best_tap) {
  const bool take = (v > best) | ((v != v) & (best == best));
  best = take ? v : best;
  best_tap = take ? tap : best_tap;
}

// The gradient's bits where TAP won, else +0.
inline float routed(float grad, std::uint32_t best_tap, std::uint32_t tap) {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(grad) &
                              (0u - static_cast<std::uint32_t>(best_tap == tap)));
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
      // Window tap by window tap over a whole output row: the inner loop runs over outputs,
      // without branches, and vectorises. The running maximum lives in the output row.
      for (std::int64_t oh = 0; oh < oh_n; ++oh) {
        float* best = dst + oh * ow_n;
        const float* top = src + oh * g.stride * g.width;
        for (std::int64_t ow = 0; ow < ow_n; ++ow) best[ow] = top[ow * g.stride];
        for (std::int64_t i = 0; i < g.kernel_h; ++i)
          for (std::int64_t j = i == 0 ? 1 : 0; j < g.kernel_w; ++j) {
            const float* tap = top + i * g.width + j;
            for (std::int64_t ow = 0; ow < ow_n; ++ow) {
              const float v = tap[ow * g.stride];
              // v != v: a NaN wins (and, once there, stays: NaN > v and v > NaN are false).
              best[ow] = v > best[ow] || v != v ? v : best[ow];
            }
          }
      }
    }
  });
}

void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::max_pool2d_backward";
  const std::int64_t planes = check_planes("kernels::max_pool2d_backward", x, g, dy);
  detail::require_pair(dx.defined() && dx.dtype() == DType::f32 && dx.device() == Device::cpu &&
                           dx.numel() == x.numel(),
                       "kernels::max_pool2d_backward", "dx must be f32 on the host shaped like x",
                       x, dx);
  const float* in = x.data<float>();
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = g.height * g.width;
  // Windows that tile the plane without overlap (stride == kernel, the usual maxpool:2).
  const bool disjoint = g.stride == g.kernel_h && g.stride == g.kernel_w;
  parallel_rows(label, planes, plane, [=](std::int64_t begin, std::int64_t end) {
    // Overlapping windows: the running maximum and its offset for a stretch of one output row,
    // tap by tap as in the forward, so the inner loops carry no branch. In both paths strict >
    // keeps the first maximum in scan order, and a NaN takes over unless one already has: the
    // forward's value, hence the position it came from.
    constexpr std::int64_t kStretch = 256;
    float best_value[kStretch];
    std::int64_t best_at[kStretch];
    std::uint32_t best_tap[kStretch];  // disjoint windows: the winning tap, i * kernel_w + j
    for (std::int64_t p = begin; p < end; ++p) {
      const float* src = in + p * plane;
      float* dst = grad_in + p * plane;
      const float* grad = grad_out + p * oh_n * ow_n;
      if (disjoint) {
        // Every element of a window is written exactly once, the gradient or 0, so only what no
        // window covers needs zeroing: the columns right of the last window, the rows below.
        for (std::int64_t h = 0; h < oh_n * g.kernel_h; ++h)
          for (std::int64_t w = ow_n * g.kernel_w; w < g.width; ++w) dst[h * g.width + w] = 0.f;
        for (std::int64_t e = oh_n * g.kernel_h * g.width; e < plane; ++e) dst[e] = 0.f;
        // A stretch of an output row at a time, as in the forward: the running maximum and the
        // tap it came from, tap by tap over the outputs (branch-free, vectorised), then each
        // window row written as the gradient where its tap won and 0 elsewhere.
        for (std::int64_t oh = 0; oh < oh_n; ++oh)
          for (std::int64_t ow0 = 0; ow0 < ow_n; ow0 += kStretch) {
            const std::int64_t n = std::min(kStretch, ow_n - ow0);
            const float* top = src + oh * g.stride * g.width + ow0 * g.stride;
            const float* share = grad + oh * ow_n + ow0;
            for (std::int64_t o = 0; o < n; ++o) {
              best_value[o] = top[o * g.stride];
              best_tap[o] = 0;
            }
            for (std::int64_t i = 0; i < g.kernel_h; ++i)
              for (std::int64_t j = i == 0 ? 1 : 0; j < g.kernel_w; ++j) {
                const float* tap = top + i * g.width + j;
                const auto tap_index = static_cast<std::uint32_t>(i * g.kernel_w + j);
                for (std::int64_t o = 0; o < n; ++o)
                  take_larger(tap[o * g.stride], tap_index, best_value[o], best_tap[o]);
              }
            for (std::int64_t i = 0; i < g.kernel_h; ++i) {
              float* row = dst + (oh * g.stride + i) * g.width + ow0 * g.stride;
              const auto first_tap = static_cast<std::uint32_t>(i * g.kernel_w);
              if (g.kernel_w == 2) {  // maxpool:2: two stores per window, interleaved by GCC
                for (std::int64_t o = 0; o < n; ++o) {
                  row[2 * o] = routed(share[o], best_tap[o], first_tap);
                  row[2 * o + 1] = routed(share[o], best_tap[o], first_tap + 1);
                }
                continue;
              }
              for (std::int64_t o = 0; o < n; ++o)
                for (std::int64_t j = 0; j < g.kernel_w; ++j)
                  row[o * g.stride + j] =
                      routed(share[o], best_tap[o], first_tap + static_cast<std::uint32_t>(j));
            }
          }
        continue;
      }
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow0 = 0; ow0 < ow_n; ow0 += kStretch) {
          const std::int64_t n = std::min(kStretch, ow_n - ow0);
          const std::int64_t corner = oh * g.stride * g.width + ow0 * g.stride;
          for (std::int64_t o = 0; o < n; ++o) {
            best_at[o] = corner + o * g.stride;
            best_value[o] = src[best_at[o]];
          }
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = i == 0 ? 1 : 0; j < g.kernel_w; ++j) {
              const std::int64_t tap = corner + i * g.width + j;
              for (std::int64_t o = 0; o < n; ++o) {
                const float v = src[tap + o * g.stride];
                const bool take = v > best_value[o] || (v != v && best_value[o] == best_value[o]);
                best_value[o] = take ? v : best_value[o];
                best_at[o] = take ? tap + o * g.stride : best_at[o];
              }
            }
          // Windows may overlap (stride < kernel), so the scatter adds.
          for (std::int64_t o = 0; o < n; ++o) dst[best_at[o]] += grad[oh * ow_n + ow0 + o];
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
