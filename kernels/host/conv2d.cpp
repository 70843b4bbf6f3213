// Host im2col, col2im, channel reordering and per-channel bias (see kernels/conv2d.hpp). im2col
// runs over the rows of the column matrix (one (channel, i, j) tap each) and col2im over input
// planes, so every thread writes its own memory; the copies run over the stretch of each row
// that lies inside the input, so the inner loops have no branch and vectorise.
#include "kernels/conv2d.hpp"

#include <algorithm>

#include "kernels/host/parallel.hpp"

// The loops here zero and copy runs of a few floats (the padding columns of each im2col row);
// GCC would turn each into a memset or memcpy call, whose overhead is the whole cost at these
// lengths (millions of calls per step on the cnn). Keep them as plain loops.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

namespace mpt::kernels::host {

namespace {
void check_sample(const char* op, const char* what, const Tensor& t, std::int64_t numel) {
  detail::require(
      t.defined() && t.device() == Device::cpu && t.dtype() == DType::f32 && t.numel() == numel, op,
      what, t);
}

// Samples of G's shape held by a tensor of NUMEL elements, after checking they are whole.
std::int64_t check_samples(const char* op, const char* what, const Tensor& t,
                           const Conv2dGeometry& g) {
  const std::int64_t sample = g.channels * g.height * g.width;
  detail::require(t.defined() && t.device() == Device::cpu && t.dtype() == DType::f32 &&
                      t.numel() >= sample && t.numel() % sample == 0,
                  op, what, t);
  return t.numel() / sample;
}

// The output columns [begin, end) whose input column ow*S - P + J lies inside [0, WIDTH): the
// rest read padding. Lets the copy loops run branch-free over the valid stretch.
struct ColumnRange {
  std::int64_t begin, end;
};
ColumnRange inside_columns(const Conv2dGeometry& g, std::int64_t j) {
  const std::int64_t ow_n = g.out_width();
  // First ow with ow*S >= P - J, and first ow with ow*S >= WIDTH + P - J (ceiling divisions).
  const auto first_at_least = [&](std::int64_t v) {
    return v <= 0 ? std::int64_t{0} : (v + g.stride - 1) / g.stride;
  };
  const std::int64_t begin = std::min(ow_n, first_at_least(g.pad - j));
  const std::int64_t end = std::min(ow_n, first_at_least(g.width + g.pad - j));
  return {begin, std::max(begin, end)};
}
}  // namespace

void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col) {
  static const std::string label = "kernels::im2col";
  constexpr const char* op = "kernels::im2col";
  const std::int64_t samples =
      check_samples(op, "x must hold whole f32 samples of the geometry's shape", x, g);
  check_sample(op, "col must be f32 [C*K*K, samples*OH*OW]", col,
               g.col_rows() * samples * g.col_columns());
  const float* in = x.data<float>();
  float* out = col.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), k = g.kernel;
  const std::int64_t positions = oh_n * ow_n, sample_size = g.channels * g.height * g.width;
  const std::int64_t row_length = samples * positions;
  // Stride 1 with the output as wide as the input ("same" padding, as in the cnn): a tap's
  // rows are the input plane shifted by a constant, so all its rows inside the input are one
  // contiguous copy, after which the columns that fell into the padding are zeroed.
  const bool shifted_plane = g.stride == 1 && ow_n == g.width;
  parallel_rows(label, g.col_rows(), row_length, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const std::int64_t c = row / (k * k), i = row / k % k, j = row % k;
      const ColumnRange inside = inside_columns(g, j);
      // Output rows [oh_begin, oh_end) read input rows inside [0, HEIGHT).
      const std::int64_t oh_begin = std::clamp<std::int64_t>(
          (g.pad - i + g.stride - 1) / g.stride, 0, oh_n);
      const std::int64_t oh_end = std::clamp<std::int64_t>(
          (g.height + g.pad - i + g.stride - 1) / g.stride, oh_begin, oh_n);
      for (std::int64_t b = 0; b < samples; ++b) {
        float* dst = out + row * row_length + b * positions;
        const float* plane = in + b * sample_size + c * g.height * g.width;
        for (std::int64_t e = 0; e < oh_begin * ow_n; ++e) dst[e] = 0.f;
        for (std::int64_t e = oh_end * ow_n; e < positions; ++e) dst[e] = 0.f;
        if (shifted_plane && oh_end > oh_begin && inside.end > inside.begin) {
          // Output (oh, ow) reads input element oh*W + ow + shift; the copy runs from the first
          // valid element of the first row to the last of the last, so it stays in the plane.
          const std::int64_t shift = (i - g.pad) * g.width + (j - g.pad);
          const std::int64_t first = oh_begin * ow_n + inside.begin;
          const std::int64_t last = (oh_end - 1) * ow_n + inside.end;
          for (std::int64_t e = first; e < last; ++e) dst[e] = plane[e + shift];
          for (std::int64_t oh = oh_begin; oh < oh_end; ++oh) {
            float* dst_row = dst + oh * ow_n;
            for (std::int64_t ow = 0; ow < inside.begin; ++ow) dst_row[ow] = 0.f;
            for (std::int64_t ow = inside.end; ow < ow_n; ++ow) dst_row[ow] = 0.f;
          }
          continue;
        }
        for (std::int64_t oh = oh_begin; oh < oh_end; ++oh) {
          float* dst_row = dst + oh * ow_n;
          // Output column ow reads input column ow*S + shift.
          const float* src = plane + (oh * g.stride - g.pad + i) * g.width;
          const std::int64_t shift = j - g.pad;
          for (std::int64_t ow = 0; ow < inside.begin; ++ow) dst_row[ow] = 0.f;
          if (g.stride == 1)
            for (std::int64_t ow = inside.begin; ow < inside.end; ++ow)
              dst_row[ow] = src[ow + shift];
          else
            for (std::int64_t ow = inside.begin; ow < inside.end; ++ow)
              dst_row[ow] = src[ow * g.stride + shift];
          for (std::int64_t ow = inside.end; ow < ow_n; ++ow) dst_row[ow] = 0.f;
        }
      }
    }
  });
}

void col2im(Tensor& col, const Conv2dGeometry& g, Tensor& dx) {
  static const std::string label = "kernels::col2im";
  constexpr const char* op = "kernels::col2im";
  const std::int64_t samples =
      check_samples(op, "dx must hold whole f32 samples of the geometry's shape", dx, g);
  check_sample(op, "col must be f32 [C*K*K, samples*OH*OW]", col,
               g.col_rows() * samples * g.col_columns());
  float* in = col.data<float>();
  float* out = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), k = g.kernel;
  const std::int64_t plane = g.height * g.width, positions = oh_n * ow_n;
  const std::int64_t row_length = samples * positions;
  // As in im2col: under stride 1 and "same" width a tap adds a shifted copy of its rows, one
  // contiguous loop, once the entries that read padding columns are zeroed (they would land on
  // the neighbouring row's edge).
  const bool shifted_plane = g.stride == 1 && ow_n == g.width;
  // One (sample, channel) plane per task: the taps of a plane overlap in dx, two planes do not.
  parallel_rows(label, samples * g.channels, k * k * positions,
                [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t b = task / g.channels, c = task % g.channels;
      float* dst = out + task * plane;
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t i = 0; i < k; ++i)
        for (std::int64_t j = 0; j < k; ++j) {
          const ColumnRange inside = inside_columns(g, j);
          float* src = in + ((c * k + i) * k + j) * row_length + b * positions;
          const std::int64_t oh_begin = std::clamp<std::int64_t>(
              (g.pad - i + g.stride - 1) / g.stride, 0, oh_n);
          const std::int64_t oh_end = std::clamp<std::int64_t>(
              (g.height + g.pad - i + g.stride - 1) / g.stride, oh_begin, oh_n);
          if (shifted_plane && oh_end > oh_begin && inside.end > inside.begin) {
            for (std::int64_t oh = oh_begin; oh < oh_end; ++oh) {
              float* src_row = src + oh * ow_n;
              for (std::int64_t ow = 0; ow < inside.begin; ++ow) src_row[ow] = 0.f;
              for (std::int64_t ow = inside.end; ow < ow_n; ++ow) src_row[ow] = 0.f;
            }
            const std::int64_t shift = (i - g.pad) * g.width + (j - g.pad);
            const std::int64_t first = oh_begin * ow_n + inside.begin;
            const std::int64_t last = (oh_end - 1) * ow_n + inside.end;
            for (std::int64_t e = first; e < last; ++e) dst[e + shift] += src[e];
            continue;
          }
          for (std::int64_t oh = oh_begin; oh < oh_end; ++oh) {
            float* dst_row = dst + (oh * g.stride - g.pad + i) * g.width;
            const std::int64_t shift = j - g.pad;
            const float* src_row = src + oh * ow_n;
            if (g.stride == 1)
              for (std::int64_t ow = inside.begin; ow < inside.end; ++ow)
                dst_row[ow + shift] += src_row[ow];
            else
              for (std::int64_t ow = inside.begin; ow < inside.end; ++ow)
                dst_row[ow * g.stride + shift] += src_row[ow];
          }
        }
    }
  });
}

void channel_rows_to_samples(const Tensor& rows, const Tensor& bias, Tensor& samples) {
  static const std::string label = "kernels::channel_rows_to_samples";
  constexpr const char* op = "kernels::channel_rows_to_samples";
  detail::require_host_f32(op, "rows must be f32 [C, B*P] on the host", rows);
  detail::require_host_f32(op, "bias must be f32 [C] on the host", bias);
  detail::require_host_f32(op, "samples must be f32 [B, C, P] on the host", samples);
  detail::require_pair(rows.rank() == 2 && bias.numel() == rows.dim(0), op,
                       "rows must be [C, B*P] with C = bias size", rows, bias);
  detail::require_pair(samples.numel() == rows.numel() && samples.numel() > 0, op,
                       "samples must hold as many elements as rows", rows, samples);
  const std::int64_t channels = rows.dim(0), row_length = rows.dim(1);
  const std::int64_t count = samples.dim(0), positions = row_length / std::max<std::int64_t>(1, count);
  detail::require_pair(count * positions == row_length, op,
                       "samples' first dimension must divide the rows' length", rows, samples);
  const float* in = rows.data<float>();
  const float* b = bias.data<float>();
  float* out = samples.data<float>();
  parallel_rows(label, count * channels, positions, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t s = task / channels, c = task % channels;
      const float* src = in + c * row_length + s * positions;
      float* dst = out + task * positions;
      const float shift = b[c];
      for (std::int64_t p = 0; p < positions; ++p) dst[p] = src[p] + shift;
    }
  });
}

void samples_to_channel_rows(const Tensor& samples, Tensor& rows) {
  static const std::string label = "kernels::samples_to_channel_rows";
  constexpr const char* op = "kernels::samples_to_channel_rows";
  detail::require_host_f32(op, "samples must be f32 [B, C, P] on the host", samples);
  detail::require_host_f32(op, "rows must be f32 [C, B*P] on the host", rows);
  detail::require_pair(rows.rank() == 2 && samples.numel() == rows.numel() && samples.numel() > 0,
                       op, "rows must be [C, B*P] with as many elements as samples", samples,
                       rows);
  const std::int64_t channels = rows.dim(0), row_length = rows.dim(1);
  const std::int64_t count = samples.dim(0), positions = row_length / std::max<std::int64_t>(1, count);
  detail::require_pair(count * positions == row_length, op,
                       "samples' first dimension must divide the rows' length", samples, rows);
  const float* in = samples.data<float>();
  float* out = rows.data<float>();
  parallel_rows(label, count * channels, positions, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t s = task / channels, c = task % channels;
      const float* src = in + task * positions;
      float* dst = out + c * row_length + s * positions;
      for (std::int64_t p = 0; p < positions; ++p) dst[p] = src[p];
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
      // P can be thousands of positions (a block's worth): float partial sums over 8 lanes of
      // 128-element stretches (16 terms each, which the compiler vectorises), added in double.
      const float* row = in + c * p;
      double sum = 0;
      std::int64_t e = 0;
      for (; e + 128 <= p; e += 128) {
        float lanes[8] = {};
        for (std::int64_t t = 0; t < 128; t += 8)
          for (int l = 0; l < 8; ++l) lanes[l] += row[e + t + l];
        for (float lane : lanes) sum += lane;
      }
      for (; e < p; ++e) sum += row[e];
      out[c] = static_cast<float>(accumulate ? out[c] + sum : sum);
    }
  });
}

}  // namespace mpt::kernels::host
