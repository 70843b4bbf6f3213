// Host im2col, col2im, channel reordering and per-channel bias (see kernels/conv2d.hpp). im2col
// runs over the rows of the column matrix (one (channel, i, j) tap each) and col2im over input
// planes, so every thread writes its own memory; the copies run over the stretch of each row
// that lies inside the input, so the inner loops have no branch and vectorise.
#include "kernels/conv2d.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>

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

// Under stride 1 and "same" width, the output columns of tap column J that read inside the
// input are the same in every output row. MASKS[J * positions + e] holds all-one bits where
// output position e reads inside the input and 0 where it reads padding, so that a tap's
// shifted copy (im2col) or add (col2im) is one branch-free loop with no per-row zero fills.
// False (and nothing written) when the K masks would not fit in kMaskWords.
constexpr std::int64_t kMaskWords = 8192;
bool column_masks(const Conv2dGeometry& g, std::uint32_t* masks) {
  const std::int64_t ow_n = g.out_width(), positions = g.out_height() * ow_n;
  if (g.stride != 1 || ow_n != g.width || g.kernel * positions > kMaskWords) return false;
  for (std::int64_t j = 0; j < g.kernel; ++j) {
    const ColumnRange inside = inside_columns(g, j);
    for (std::int64_t e = 0; e < positions; ++e) {
      const std::int64_t ow = e % ow_n;
      masks[j * positions + e] = ow >= inside.begin && ow < inside.end ? ~0u : 0u;
    }
  }
  return true;
}

// V, or +0 where MASK is 0: exactly what zeroing the entry would give.
inline float masked(float v, std::uint32_t mask) {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) & mask);
}
// A 16-bit element's bits (f16 or bf16: +0 is all zero bits in both), masked the same way.
inline std::uint16_t masked(std::uint16_t v, std::uint32_t mask) {
  return static_cast<std::uint16_t>(v & mask);
}

// im2col over elements of type T (float, or the bits of a 16-bit float): a copy, so the dtype
// only sets the width.
template <typename T>
void im2col_typed(const Tensor& x, const Conv2dGeometry& g, Tensor& col, std::int64_t samples) {
  static const std::string label = "kernels::im2col";
  const T* in = static_cast<const T*>(x.raw());
  T* out = static_cast<T*>(col.raw());
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), k = g.kernel;
  const std::int64_t positions = oh_n * ow_n, sample_size = g.channels * g.height * g.width;
  const std::int64_t row_length = samples * positions;
  // Stride 1 with the output as wide as the input ("same" padding, as in the cnn): a tap's
  // rows are the input plane shifted by a constant, so all its rows inside the input are one
  // contiguous copy, masked where the columns fall into the padding (column_masks).
  std::uint32_t mask_table[kMaskWords];
  const std::uint32_t* masks = column_masks(g, mask_table) ? mask_table : nullptr;
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
        T* dst = out + row * row_length + b * positions;
        const T* plane = in + b * sample_size + c * g.height * g.width;
        if (masks && oh_end > oh_begin && inside.end > inside.begin) {
          // Output (oh, ow) reads input element oh*W + ow + shift; the copy runs from the first
          // valid element of the first row to the last of the last, so it stays in the plane.
          const std::int64_t shift = (i - g.pad) * g.width + (j - g.pad);
          const std::int64_t first = oh_begin * ow_n + inside.begin;
          const std::int64_t last = (oh_end - 1) * ow_n + inside.end;
          const std::uint32_t* mask = masks + j * positions;
          for (std::int64_t e = 0; e < first; ++e) dst[e] = T{};
          for (std::int64_t e = first; e < last; ++e) dst[e] = masked(plane[e + shift], mask[e]);
          for (std::int64_t e = last; e < positions; ++e) dst[e] = T{};
          continue;
        }
        for (std::int64_t e = 0; e < oh_begin * ow_n; ++e) dst[e] = T{};
        for (std::int64_t e = oh_end * ow_n; e < positions; ++e) dst[e] = T{};
        for (std::int64_t oh = oh_begin; oh < oh_end; ++oh) {
          T* dst_row = dst + oh * ow_n;
          // Output column ow reads input column ow*S + shift.
          const T* src = plane + (oh * g.stride - g.pad + i) * g.width;
          const std::int64_t shift = j - g.pad;
          for (std::int64_t ow = 0; ow < inside.begin; ++ow) dst_row[ow] = T{};
          if (g.stride == 1)
            for (std::int64_t ow = inside.begin; ow < inside.end; ++ow)
              dst_row[ow] = src[ow + shift];
          else
            for (std::int64_t ow = inside.begin; ow < inside.end; ++ow)
              dst_row[ow] = src[ow * g.stride + shift];
          for (std::int64_t ow = inside.end; ow < ow_n; ++ow) dst_row[ow] = T{};
        }
      }
    }
  });
}
}  // namespace

void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col) {
  constexpr const char* op = "kernels::im2col";
  const DType dtype = x.defined() ? x.dtype() : DType::f32;
  const std::int64_t sample = g.channels * g.height * g.width;
  detail::require(x.defined() && x.device() == Device::cpu &&
                      (dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16) &&
                      x.numel() >= sample && x.numel() % sample == 0,
                  op, "x must hold whole f32, f16 or bf16 samples of the geometry's shape", x);
  const std::int64_t samples = x.numel() / sample;
  detail::require_pair(col.defined() && col.device() == Device::cpu && col.dtype() == dtype &&
                           col.numel() == g.col_rows() * samples * g.col_columns(),
                       op, "col must be [C*K*K, samples*OH*OW] in x's dtype", x, col);
  if (dtype == DType::f32)
    im2col_typed<float>(x, g, col, samples);
  else
    im2col_typed<std::uint16_t>(x, g, col, samples);
}

void col2im(Tensor& col, const Conv2dGeometry& g, Tensor& dx) {
  static const std::string label = "kernels::col2im";
  constexpr const char* op = "kernels::col2im";
  const std::int64_t samples =
      check_samples(op, "dx must hold whole f32 samples of the geometry's shape", dx, g);
  check_sample(op, "col must be f32 [C*K*K, samples*OH*OW]", col,
               g.col_rows() * samples * g.col_columns());
  const float* in = col.data<float>();
  float* out = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), k = g.kernel;
  const std::int64_t plane = g.height * g.width, positions = oh_n * ow_n;
  const std::int64_t row_length = samples * positions;
  // As in im2col: under stride 1 and "same" width a tap adds a shifted copy of its rows, one
  // contiguous loop, with the entries that read padding columns masked to 0 (they would land
  // on the neighbouring row's edge).
  std::uint32_t mask_table[kMaskWords];
  const std::uint32_t* masks = column_masks(g, mask_table) ? mask_table : nullptr;
  // One channel per task: the taps of a plane overlap in dx, two channels' planes do not. Tap
  // by tap, the task reads the tap's row of COL front to back (every sample of the block), and
  // adds into the channel's planes of the block's samples, which stay in L1.
  parallel_rows(label, g.channels, samples * k * k * positions,
                [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c) {
      for (std::int64_t b = 0; b < samples; ++b) {
        float* dst = out + (b * g.channels + c) * plane;
        for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      }
      for (std::int64_t i = 0; i < k; ++i)
        for (std::int64_t j = 0; j < k; ++j) {
          const ColumnRange inside = inside_columns(g, j);
          const float* row = in + ((c * k + i) * k + j) * row_length;
          const std::int64_t oh_begin = std::clamp<std::int64_t>(
              (g.pad - i + g.stride - 1) / g.stride, 0, oh_n);
          const std::int64_t oh_end = std::clamp<std::int64_t>(
              (g.height + g.pad - i + g.stride - 1) / g.stride, oh_begin, oh_n);
          if (oh_end <= oh_begin || inside.end <= inside.begin) continue;  // all padding
          for (std::int64_t b = 0; b < samples; ++b) {
            const float* src = row + b * positions;
            float* dst = out + (b * g.channels + c) * plane;
            if (masks) {
              const std::int64_t shift = (i - g.pad) * g.width + (j - g.pad);
              const std::int64_t first = oh_begin * ow_n + inside.begin;
              const std::int64_t last = (oh_end - 1) * ow_n + inside.end;
              const std::uint32_t* mask = masks + j * positions;
              for (std::int64_t e = first; e < last; ++e)
                dst[e + shift] += masked(src[e], mask[e]);
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
    }
  });
}

void channel_rows_to_samples(const Tensor& rows, const Tensor& bias, Tensor& samples, bool relu) {
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
      if (relu) {
        for (std::int64_t p = 0; p < positions; ++p) {
          const float v = src[p] + shift;
          dst[p] = v < 0.f ? 0.f : v;
        }
        continue;
      }
      for (std::int64_t p = 0; p < positions; ++p) dst[p] = src[p] + shift;
    }
  });
}

void samples_to_channel_rows(const Tensor& samples, Tensor& rows, const Tensor* relu_output) {
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
  const DType relu_dtype = relu_output ? relu_output->dtype() : DType::f32;
  if (relu_output)
    detail::require_pair(
        relu_output->defined() && relu_output->device() == Device::cpu &&
            (relu_dtype == DType::f32 || relu_dtype == DType::f16 || relu_dtype == DType::bf16) &&
            relu_output->numel() == samples.numel(),
        op, "relu_output must be f32, f16 or bf16 on the host, shaped like samples", samples,
        *relu_output);
  const float* in = samples.data<float>();
  const float* mask =
      relu_output && relu_dtype == DType::f32 ? relu_output->data<float>() : nullptr;
  // 16-bit outputs are tested on their bits, not widened: y > 0 exactly when the bits lie in
  // [1, inf]: positive, non-zero, not NaN (as kernels::relu_backward).
  const auto* mask16 = relu_output && relu_dtype != DType::f32
                           ? static_cast<const std::uint16_t*>(relu_output->raw())
                           : nullptr;
  const std::uint16_t inf = relu_dtype == DType::f16 ? 0x7c00u : 0x7f80u;
  float* out = rows.data<float>();
  parallel_rows(label, count * channels, positions, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t s = task / channels, c = task % channels;
      const float* src = in + task * positions;
      float* dst = out + c * row_length + s * positions;
      if (mask) {
        const float* y = mask + task * positions;
        for (std::int64_t p = 0; p < positions; ++p) {
          const float g = src[p];  // loaded unconditionally, so the select becomes a blend
          dst[p] = y[p] > 0.f ? g : 0.f;
        }
      } else if (mask16) {
        const std::uint16_t* y = mask16 + task * positions;
        for (std::int64_t p = 0; p < positions; ++p) {
          const float g = src[p];
          dst[p] = static_cast<std::uint16_t>(y[p] - 1u) < inf ? g : 0.f;
        }
      } else {
        for (std::int64_t p = 0; p < positions; ++p) dst[p] = src[p];
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
