// Host im2col, col2im and per-channel bias (see kernels/conv2d.hpp). Loops run over the rows of
// the column matrix (one (channel, i, j) tap each), so every thread writes its own rows.
#include "kernels/conv2d.hpp"

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {
void check_sample(const char* op, const char* what, const Tensor& t, std::int64_t numel) {
  detail::require(
      t.defined() && t.device() == Device::cpu && t.dtype() == DType::f32 && t.numel() == numel, op,
      what, t);
}
}  // namespace

void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col) {
  static const std::string label = "kernels::im2col";
  constexpr const char* op = "kernels::im2col";
  check_sample(op, "x must be one f32 sample of the geometry's shape", x,
               g.channels * g.height * g.width);
  check_sample(op, "col must be f32 [C*K*K, OH*OW]", col, g.col_rows() * g.col_columns());
  const float* in = x.data<float>();
  float* out = col.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), k = g.kernel;
  parallel_rows(label, g.col_rows(), g.col_columns(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const std::int64_t c = row / (k * k), i = row / k % k, j = row % k;
      float* dst = out + row * oh_n * ow_n;
      for (std::int64_t oh = 0; oh < oh_n; ++oh) {
        const std::int64_t h = oh * g.stride - g.pad + i;
        const bool row_inside = h >= 0 && h < g.height;
        const float* src = in + (c * g.height + h) * g.width;
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const std::int64_t w = ow * g.stride - g.pad + j;
          dst[oh * ow_n + ow] = row_inside && w >= 0 && w < g.width ? src[w] : 0.f;
        }
      }
    }
  });
}

void col2im(const Tensor& col, const Conv2dGeometry& g, Tensor& dx) {
  static const std::string label = "kernels::col2im";
  constexpr const char* op = "kernels::col2im";
  check_sample(op, "col must be f32 [C*K*K, OH*OW]", col, g.col_rows() * g.col_columns());
  check_sample(op, "dx must be one f32 sample of the geometry's shape", dx,
               g.channels * g.height * g.width);
  const float* in = col.data<float>();
  float* out = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), k = g.kernel;
  const std::int64_t plane = g.height * g.width;
  // One channel per task: the taps of a channel overlap in dx, those of two channels do not.
  parallel_rows(label, g.channels, k * k * oh_n * ow_n, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c) {
      float* dst = out + c * plane;
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t i = 0; i < k; ++i)
        for (std::int64_t j = 0; j < k; ++j) {
          const float* src = in + ((c * k + i) * k + j) * oh_n * ow_n;
          for (std::int64_t oh = 0; oh < oh_n; ++oh) {
            const std::int64_t h = oh * g.stride - g.pad + i;
            if (h < 0 || h >= g.height) continue;
            for (std::int64_t ow = 0; ow < ow_n; ++ow) {
              const std::int64_t w = ow * g.stride - g.pad + j;
              if (w >= 0 && w < g.width) dst[h * g.width + w] += src[oh * ow_n + ow];
            }
          }
        }
    }
  });
}

void channel_bias_forward(Tensor& y, const Tensor& bias) {
  static const std::string label = "kernels::channel_bias_forward";
  constexpr const char* op = "kernels::channel_bias_forward";
  detail::require_host_f32(op, "y must be f32 [C, P] on the host", y);
  detail::require_host_f32(op, "bias must be f32 [C] on the host", bias);
  detail::require_pair(y.rank() == 2 && bias.numel() == y.dim(0), op,
                       "y must be [C, P] with C = bias size", y, bias);
  float* out = y.data<float>();
  const float* b = bias.data<float>();
  const std::int64_t p = y.dim(1);
  parallel_rows(label, y.dim(0), p, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c)
      for (std::int64_t e = 0; e < p; ++e) out[c * p + e] += b[c];
  });
}

void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate) {
  static const std::string label = "kernels::channel_bias_backward";
  constexpr const char* op = "kernels::channel_bias_backward";
  detail::require_host_f32(op, "dy must be f32 [C, P] on the host", dy);
  detail::require_host_f32(op, "bias_grad must be f32 [C] on the host", bias_grad);
  detail::require_pair(dy.rank() == 2 && bias_grad.numel() == dy.dim(0), op,
                       "dy must be [C, P] with C = bias size", dy, bias_grad);
  const float* in = dy.data<float>();
  float* out = bias_grad.data<float>();
  const std::int64_t p = dy.dim(1);
  parallel_rows(label, dy.dim(0), p, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c) {
      double sum = 0;  // P can be thousands of positions
      for (std::int64_t e = 0; e < p; ++e) sum += in[c * p + e];
      out[c] = static_cast<float>(accumulate ? out[c] + sum : sum);
    }
  });
}

}  // namespace mpt::kernels::host
