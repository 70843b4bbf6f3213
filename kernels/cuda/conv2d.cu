// CUDA im2col, col2im, channel reordering and per-channel bias (see kernels/conv2d.hpp). One
// thread per output element, each deriving its indices from its own position, so no two threads
// write the same memory; col2im gathers over the windows that read its input element, in the
// host's tap order, so its sums are the host's bit for bit without atomics.
#include <algorithm>

#include "kernels/conv2d.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {
namespace {

// The geometry as plain numbers, for __device__ lambdas to capture (Conv2dGeometry's helpers
// are host functions).
struct Window {
  std::int64_t channels, height, width, kernel, stride, pad, out_height, out_width;
  std::int64_t sample_size() const { return channels * height * width; }
  std::int64_t positions() const { return out_height * out_width; }
  std::int64_t col_rows() const { return channels * kernel * kernel; }
};

// G as a Window, after checking it describes at least one window (T names the call's input).
Window window_of(const char* op, const Conv2dGeometry& g, const Tensor& t) {
  detail::require(g.channels > 0 && g.height > 0 && g.width > 0 && g.kernel > 0 && g.stride > 0 &&
                      g.pad >= 0 && g.height + 2 * g.pad >= g.kernel &&
                      g.width + 2 * g.pad >= g.kernel,
                  op,
                  "the geometry needs positive channels, plane, kernel and stride, pad >= 0 and "
                  "a kernel no larger than the padded plane",
                  t);
  return {g.channels, g.height, g.width, g.kernel, g.stride, g.pad, g.out_height(), g.out_width()};
}

// Samples of W's shape held by T (f32 on the cuda device), after checking they are whole.
std::int64_t check_samples(const char* op, const char* what, const Tensor& t, const Window& w) {
  const std::int64_t sample = w.sample_size();
  detail::require(t.defined() && t.device() == Device::cuda && t.dtype() == DType::f32 &&
                      t.numel() >= sample && t.numel() % sample == 0,
                  op, what, t);
  return t.numel() / sample;
}

void check_numel(const char* op, const char* what, const Tensor& t, std::int64_t numel) {
  detail::require(
      t.defined() && t.device() == Device::cuda && t.dtype() == DType::f32 && t.numel() == numel,
      op, what, t);
}

// The [C, B*P] <-> [B, C, P] pairing of channel_rows_to_samples and samples_to_channel_rows:
// C = ROWS's first dimension, B = SAMPLES's, P = the rows' length / B.
struct ChannelRows {
  std::int64_t channels, row_length, positions;
};
ChannelRows channel_rows(const char* op, const Tensor& rows, const Tensor& samples) {
  detail::require_pair(rows.rank() == 2 && samples.rank() >= 1 && samples.numel() == rows.numel() &&
                           samples.numel() > 0,
                       op, "rows must be [C, B*P] with as many elements as samples [B, C, P]", rows,
                       samples);
  const std::int64_t row_length = rows.dim(1), count = samples.dim(0);
  const std::int64_t positions = row_length / count;
  detail::require_pair(count * positions == row_length, op,
                       "samples' first dimension must divide the rows' length", rows, samples);
  return {rows.dim(0), row_length, positions};
}

// One thread block per channel (grid-stride over channels beyond the grid limit): double sums
// per thread, then a fixed shared-memory tree, so the result does not depend on scheduling.
constexpr std::int64_t kMaxChannelBlocks = 65535;
__global__ void channel_sums_kernel(const float* dy, std::int64_t channels, std::int64_t positions,
                                    bool accumulate, float* bias_grad) {
  __shared__ double partial[kThreads];
  for (std::int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    const float* row = dy + c * positions;
    double sum = 0;
    for (std::int64_t e = threadIdx.x; e < positions; e += kThreads) sum += row[e];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
      __syncthreads();
    }
    // As the host: the old value (with ACCUMULATE) and the sum added in double, rounded once.
    if (threadIdx.x == 0)
      bias_grad[c] = static_cast<float>(accumulate ? bias_grad[c] + partial[0] : partial[0]);
    __syncthreads();  // partial[0] is read before the next channel overwrites it
  }
}

// COL[row, column] = X's element under window COLUMN's tap ROW, or T{} (+0) over the padding.
template <typename T>
void im2col_typed(const char* op, const Window& w, const T* in, T* out, std::int64_t row_length) {
  const std::int64_t positions = w.positions(), sample_size = w.sample_size();
  // COL[row, column]: row = (c, i, j) tap, column = (b, oh, ow) window.
  launch_elementwise(op, w.col_rows() * row_length, [=] __device__(std::int64_t index) {
    const std::int64_t row = index / row_length, column = index % row_length;
    const std::int64_t c = row / (w.kernel * w.kernel), i = row / w.kernel % w.kernel,
                       j = row % w.kernel;
    const std::int64_t b = column / positions, e = column % positions;
    const std::int64_t oh = e / w.out_width, ow = e % w.out_width;
    const std::int64_t ih = oh * w.stride - w.pad + i, iw = ow * w.stride - w.pad + j;
    T value{};  // padding
    if (ih >= 0 && ih < w.height && iw >= 0 && iw < w.width)
      value = in[b * sample_size + (c * w.height + ih) * w.width + iw];
    out[index] = value;
  });
}

}  // namespace

void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col) {
  constexpr const char* op = "kernels::cuda::im2col";
  const Window w = window_of(op, g, x);
  const DType dtype = x.defined() ? x.dtype() : DType::f32;
  const std::int64_t sample = w.sample_size();
  detail::require(x.defined() && x.device() == Device::cuda &&
                      (dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16) &&
                      x.numel() >= sample && x.numel() % sample == 0,
                  op,
                  "x must hold whole f32, f16 or bf16 samples of the geometry's shape on the cuda "
                  "device",
                  x);
  const std::int64_t samples = x.numel() / sample;
  const std::int64_t positions = w.positions(), row_length = samples * positions;
  detail::require_pair(col.defined() && col.device() == Device::cuda && col.dtype() == dtype &&
                           col.numel() == w.col_rows() * row_length,
                       op, "col must be [C*K*K, samples*OH*OW] in x's dtype on the cuda device", x,
                       col);
  if (dtype == DType::f32)
    im2col_typed(op, w, x.data<float>(), col.data<float>(), row_length);
  else  // a copy: the 16-bit patterns as they are (+0 is all zero bits in f16 and bf16)
    im2col_typed(op, w, static_cast<const std::uint16_t*>(x.raw()),
                 static_cast<std::uint16_t*>(col.raw()), row_length);
}

void col2im(Tensor& col, const Conv2dGeometry& g, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::col2im";
  const Window w = window_of(op, g, dx);
  const std::int64_t samples = check_samples(
      op, "dx must hold whole f32 samples of the geometry's shape on the cuda device", dx, w);
  const std::int64_t positions = w.positions(), row_length = samples * positions;
  check_numel(op, "col must be f32 [C*K*K, samples*OH*OW] on the cuda device", col,
              w.col_rows() * row_length);
  const float* in = col.data<float>();
  float* out = dx.data<float>();
  const std::int64_t sample_size = w.sample_size(), plane = w.height * w.width;
  // DX[b, c, h, x] gathers COL[(c, i, j), (b, oh, ow)] over the windows with
  // oh*S - P + i = h and ow*S - P + j = x, taps in the host's order (i, then j) from +0.
  launch_elementwise(op, samples * sample_size, [=] __device__(std::int64_t index) {
    const std::int64_t b = index / sample_size, in_sample = index % sample_size;
    const std::int64_t c = in_sample / plane, h = in_sample % plane / w.width,
                       x = in_sample % w.width;
    const float* column_base = in + b * positions;
    float sum = 0.f;
    for (std::int64_t i = 0; i < w.kernel; ++i) {
      const std::int64_t row_offset = h + w.pad - i;  // = oh * S for a window that reads h
      if (row_offset < 0 || row_offset % w.stride != 0) continue;
      const std::int64_t oh = row_offset / w.stride;
      if (oh >= w.out_height) continue;
      for (std::int64_t j = 0; j < w.kernel; ++j) {
        const std::int64_t column_offset = x + w.pad - j;  // = ow * S
        if (column_offset < 0 || column_offset % w.stride != 0) continue;
        const std::int64_t ow = column_offset / w.stride;
        if (ow >= w.out_width) continue;
        sum +=
            column_base[((c * w.kernel + i) * w.kernel + j) * row_length + oh * w.out_width + ow];
      }
    }
    out[index] = sum;
  });
}

void channel_rows_to_samples(const Tensor& rows, const Tensor& bias, Tensor& samples, bool relu) {
  constexpr const char* op = "kernels::cuda::channel_rows_to_samples";
  require_cuda(op, "rows must be f32 [C, B*P] on the cuda device", rows, DType::f32);
  require_cuda(op, "bias must be f32 [C] on the cuda device", bias, DType::f32);
  require_cuda(op, "samples must be f32 [B, C, P] on the cuda device", samples, DType::f32);
  detail::require_pair(rows.rank() == 2 && bias.numel() == rows.dim(0), op,
                       "rows must be [C, B*P] with C = bias size", rows, bias);
  const ChannelRows shape = channel_rows(op, rows, samples);
  const std::int64_t channels = shape.channels, row_length = shape.row_length,
                     positions = shape.positions;
  const float* in = rows.data<float>();
  const float* b = bias.data<float>();
  float* out = samples.data<float>();
  launch_elementwise(op, samples.numel(), [=] __device__(std::int64_t index) {
    const std::int64_t task = index / positions, p = index % positions;
    const std::int64_t s = task / channels, c = task % channels;
    const float v = in[c * row_length + s * positions + p] + b[c];
    out[index] = relu && v < 0.f ? 0.f : v;  // a NaN stays, as kernels::relu_forward
  });
}

void samples_to_channel_rows(const Tensor& samples, Tensor& rows, const Tensor* relu_output) {
  constexpr const char* op = "kernels::cuda::samples_to_channel_rows";
  require_cuda(op, "samples must be f32 [B, C, P] on the cuda device", samples, DType::f32);
  require_cuda(op, "rows must be f32 [C, B*P] on the cuda device", rows, DType::f32);
  const ChannelRows shape = channel_rows(op, rows, samples);
  const std::int64_t channels = shape.channels, row_length = shape.row_length,
                     positions = shape.positions;
  const DType relu_dtype = relu_output ? relu_output->dtype() : DType::f32;
  if (relu_output)
    detail::require_pair(relu_output->defined() && relu_output->device() == Device::cuda &&
                             is_float_dtype(relu_dtype) && relu_output->numel() == samples.numel(),
                         op,
                         "relu_output must be f32, f16 or bf16 on the cuda device, shaped like "
                         "samples",
                         samples, *relu_output);
  const float* in = samples.data<float>();
  const float* mask =
      relu_output && relu_dtype == DType::f32 ? relu_output->data<float>() : nullptr;
  // 16-bit outputs are tested on their bits, as on the host: y > 0 exactly when the bits lie
  // in [1, inf]: positive, non-zero, not NaN.
  const auto* mask16 = relu_output && relu_dtype != DType::f32
                           ? static_cast<const std::uint16_t*>(relu_output->raw())
                           : nullptr;
  const std::uint16_t inf = relu_dtype == DType::f16 ? 0x7c00u : 0x7f80u;
  float* out = rows.data<float>();
  launch_elementwise(op, samples.numel(), [=] __device__(std::int64_t index) {
    const std::int64_t task = index / positions, p = index % positions;
    const std::int64_t s = task / channels, c = task % channels;
    float g = in[index];
    if (mask)
      g = mask[index] > 0.f ? g : 0.f;
    else if (mask16)
      g = static_cast<std::uint16_t>(mask16[index] - 1u) < inf ? g : 0.f;
    out[c * row_length + s * positions + p] = g;
  });
}

void channel_bias_forward(Tensor& y, const Tensor& bias) {
  constexpr const char* op = "kernels::cuda::channel_bias_forward";
  require_cuda(op, "y must be f32 [C, P] on the cuda device", y, DType::f32);
  require_cuda(op, "bias must be f32 [C] on the cuda device", bias, DType::f32);
  detail::require_pair(y.rank() == 2 && bias.numel() == y.dim(0), op,
                       "y must be [C, P] with C = bias size", y, bias);
  float* out = y.data<float>();
  const float* b = bias.data<float>();
  const std::int64_t positions = y.dim(1);
  launch_channel_elementwise(op, y.numel(), positions, bias.numel(),
                             [=] __device__(std::int64_t i, std::int64_t c) { out[i] += b[c]; });
}

void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate) {
  constexpr const char* op = "kernels::cuda::channel_bias_backward";
  require_cuda(op, "dy must be f32 [C, P] on the cuda device", dy, DType::f32);
  require_cuda(op, "bias_grad must be f32 [C] on the cuda device", bias_grad, DType::f32);
  detail::require_pair(dy.rank() == 2 && bias_grad.numel() == dy.dim(0), op,
                       "dy must be [C, P] with C = bias size", dy, bias_grad);
  const std::int64_t channels = dy.dim(0), positions = dy.dim(1);
  if (channels == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(channels, kMaxChannelBlocks));
  channel_sums_kernel<<<blocks, kThreads, 0, stream()>>>(dy.data<float>(), channels, positions,
                                                         accumulate, bias_grad.data<float>());
  check_launch(op);
}

}  // namespace mpt::kernels::cuda
