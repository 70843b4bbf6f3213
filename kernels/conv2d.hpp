// The pieces of a 2-D convolution lowered to matmul (im2col + GEMM): unfolding a block of
// samples' windows into the columns of one matrix (so that one large GEMM serves the block),
// folding column gradients back, moving channels between sample-major and channel-major
// order, and the per-channel bias.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// One NCHW sample of CHANNELS x HEIGHT x WIDTH under a square KERNEL, STRIDE and zero PAD
// (dilation 1): the windows lie at out_height() x out_width() positions.
struct Conv2dGeometry {
  std::int64_t channels = 0, height = 0, width = 0, kernel = 1, stride = 1, pad = 0;
  std::int64_t out_height() const { return (height + 2 * pad - kernel) / stride + 1; }
  std::int64_t out_width() const { return (width + 2 * pad - kernel) / stride + 1; }
  std::int64_t col_rows() const { return channels * kernel * kernel; }
  std::int64_t col_columns() const { return out_height() * out_width(); }
};

namespace host {
void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col);
void col2im(Tensor& col, const Conv2dGeometry& g, Tensor& dx);
void channel_rows_to_samples(const Tensor& rows, const Tensor& bias, Tensor& samples, bool relu);
void samples_to_channel_rows(const Tensor& samples, Tensor& rows, const Tensor* relu_output);
void channel_bias_forward(Tensor& y, const Tensor& bias);
void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate);

// The whole convolution through oneDNN (kernels/host/conv2d_dnnl.cpp): the host's counterpart of
// cuda::CudnnConv2d below, with the same contracts. Forward, backward data and weights (with the
// bias) are oneDNN's direct convolution primitives in the formats it prefers; the tensors stay
// NCHW and are reordered to and from those formats per call (the f32 input of a first layer is
// rounded to DTYPE by that reorder). DTYPE is f32, or bf16 where host_matmul_takes(bf16) (AMX or
// AVX512-BF16 kernels): plan() returns false, with describe() saying why, for any other dtype,
// for a build without oneDNN, and where oneDNN has only its reference kernels, so that the
// layer keeps its im2col path. Scratch for the reordered tensors is planned for MAX_BATCH; a
// short batch gets its primitives the first time it is seen.
class DnnlConv2d {
 public:
  DnnlConv2d();
  ~DnnlConv2d();
  DnnlConv2d(DnnlConv2d&&) noexcept;
  DnnlConv2d& operator=(DnnlConv2d&&) noexcept;

  bool plan(const Conv2dGeometry& g, std::int64_t out_channels, std::int64_t max_batch,
            DType dtype, bool relu);
  bool planned() const;
  // Y = conv(X, WEIGHT) + BIAS[c] (then the ReLU): X [n, C, H, W] in DTYPE or f32, WEIGHT
  // [K, C, k, k] in DTYPE, BIAS [K] f32, Y [n, K, OH, OW] in DTYPE, n <= MAX_BATCH.
  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y);
  // From DY (DTYPE; masked by Y > 0 first with the ReLU): overwrites WEIGHT_GRAD and BIAS_GRAD
  // (f32 or DTYPE: oneDNN sums over the batch in f32, rounded once) and, unless null, DX (like
  // X). X and Y: the forward's.
  void backward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& dy,
                Tensor& weight_grad, Tensor& bias_grad, Tensor* dx);
  // "fwd=<oneDNN kernel> bwd_data=... bwd_weights=..." for the planned batch, or why plan()
  // returned false.
  std::string describe() const;
  std::int64_t scratch_bytes() const;

 private:
  void validate(const char* op, const Tensor& x, const Tensor& weight) const;
  struct State;
  std::unique_ptr<State> state_;
};
}  // namespace host
// The CUDA twins (kernels/cuda/conv2d.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col);
void col2im(Tensor& col, const Conv2dGeometry& g, Tensor& dx);
void channel_rows_to_samples(const Tensor& rows, const Tensor& bias, Tensor& samples, bool relu);
void samples_to_channel_rows(const Tensor& samples, Tensor& rows, const Tensor* relu_output);
void channel_bias_forward(Tensor& y, const Tensor& bias);
void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate);

// The whole convolution through cuDNN (kernels/cuda/conv2d_cudnn.cu, built where cuDNN is:
// MPTRAIN_HAVE_CUDNN): forward, backward data, filter and bias for batches of NCHW samples of
// one geometry, tensors in f32, f16 or bf16 with FP32 compute. plan() chooses the three
// algorithms once (cuDNN's _v7 heuristics, deterministic ones only) and reserves their
// workspace in one buffer per device that every plan shares (grown at plan time only; layers
// run one after another on the compute stream), so forward and backward allocate nothing.
class CudnnConv2d {
 public:
  CudnnConv2d();
  ~CudnnConv2d();
  CudnnConv2d(CudnnConv2d&&) noexcept;
  CudnnConv2d& operator=(CudnnConv2d&&) noexcept;

  // For batches of up to MAX_BATCH samples of G into OUT_CHANNELS, weights and activations in
  // DTYPE; RELU: a ReLU follows the conv (applied in forward, its mask in backward). False,
  // with why(), when cuDNN has no deterministic algorithm for this shape and dtype (the
  // caller then keeps its im2col path); a failing cuDNN call aborts naming it.
  bool plan(const Conv2dGeometry& g, std::int64_t out_channels, std::int64_t max_batch,
            DType dtype, bool relu);
  bool planned() const;
  // Y = conv(X, WEIGHT) + BIAS[c] (then the ReLU): X [n, C, H, W] in DTYPE or f32 (rounded to
  // DTYPE on the way: the model's first layer), WEIGHT [K, C, k, k] in DTYPE, BIAS [K] f32,
  // Y [n, K, OH, OW] in DTYPE, n <= MAX_BATCH. A batch size other than MAX_BATCH gets its own
  // descriptors and algorithms the first time it is seen (a short last batch).
  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y);
  // From DY (DTYPE, like Y; masked by Y > 0 on the way with the ReLU): overwrites WEIGHT_GRAD
  // (DTYPE: cuDNN sums over the batch in f32 and rounds once), BIAS_GRAD (DTYPE or f32: an f32
  // sum in a fixed order, rounded once) and, unless null, DX (like X). X and Y: the forward's.
  void backward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& dy,
                Tensor& weight_grad, Tensor& bias_grad, Tensor* dx);
  // "fwd=IMPLICIT_PRECOMP_GEMM bwd_data=ALGO_1 bwd_filter=ALGO_1 workspace=123456" for the
  // planned batch, or why plan() returned false.
  std::string describe() const;
  // Bytes this plan asked of the shared buffer (workspace and staging).
  std::int64_t scratch_bytes() const;

 private:
  void validate(const char* op, const Tensor& x, const Tensor& weight) const;
  struct State;
  std::unique_ptr<State> state_;
};
}  // namespace cuda

// COL[c*K*K + i*K + j, b*OH*OW + oh*OW + ow] = X[b, c, oh*S - P + i, ow*S - P + j] (0 outside
// X) for X holding B >= 1 whole samples of G's shape; COL is [col_rows, B*col_columns] in X's
// dtype (f32, f16 or bf16: a copy, exact in any width), caller-owned. B = 1 is one sample's
// [col_rows, col_columns] matrix.
inline void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& col) {
  detail::require_disjoint("kernels::im2col", "col must not overlap x", x, col);
  MPT_DISPATCH_CUDA(x, im2col, x, g, col);
  host::im2col(x, g, col);
}

// The adjoint of im2col: DX (B f32 samples) = the sum of COL's entries ([col_rows,
// B*col_columns]) over the windows that read each input element. Overwrites DX. COL is the
// caller's scratch: its entries for windows over padding may be zeroed on the way.
inline void col2im(Tensor& col, const Conv2dGeometry& g, Tensor& dx) {
  detail::require_disjoint("kernels::col2im", "dx must not overlap col", col, dx);
  MPT_DISPATCH_CUDA(col, col2im, col, g, dx);
  host::col2im(col, g, dx);
}

// SAMPLES[b, c, p] = ROWS[c, b*P + p] + BIAS[c]: a block's GEMM output [C, B*P] (channel-major)
// back into B NCHW samples [B, C, P], with the bias added on the way. With RELU, the ReLU that
// follows the conv too (v < 0 ? 0 : v, as kernels::relu_forward: a NaN stays). All f32,
// caller-owned.
inline void channel_rows_to_samples(const Tensor& rows, const Tensor& bias, Tensor& samples,
                                    bool relu = false) {
  detail::require_disjoint("kernels::channel_rows_to_samples", "samples must not overlap rows",
                           rows, samples);
  detail::require_disjoint("kernels::channel_rows_to_samples", "samples must not overlap bias",
                           bias, samples);
  MPT_DISPATCH_CUDA(rows, channel_rows_to_samples, rows, bias, samples, relu);
  host::channel_rows_to_samples(rows, bias, samples, relu);
}

// ROWS[c, b*P + p] = SAMPLES[b, c, p]: B NCHW samples into channel-major [C, B*P], the layout
// the block's weight- and input-gradient GEMMs read. ROWS's shape gives C; both f32. With
// RELU_OUTPUT (shaped like SAMPLES, f32, f16 or bf16: the forward's output after a fused ReLU,
// read in its storage dtype), the ReLU's backward too: 0 where RELU_OUTPUT is not > 0, as
// kernels::relu_backward.
inline void samples_to_channel_rows(const Tensor& samples, Tensor& rows,
                                    const Tensor* relu_output = nullptr) {
  detail::require_disjoint("kernels::samples_to_channel_rows", "rows must not overlap samples",
                           samples, rows);
  if (relu_output)
    detail::require_disjoint("kernels::samples_to_channel_rows",
                             "rows must not overlap relu_output", *relu_output, rows);
  MPT_DISPATCH_CUDA(samples, samples_to_channel_rows, samples, rows, relu_output);
  host::samples_to_channel_rows(samples, rows, relu_output);
}

// Y[c, p] += BIAS[c] for f32 Y [C, P] (channels first, as a conv output sample is).
inline void channel_bias_forward(Tensor& y, const Tensor& bias) {
  detail::require_disjoint("kernels::channel_bias_forward", "y must not overlap bias", bias, y);
  MPT_DISPATCH_CUDA(y, channel_bias_forward, y, bias);
  host::channel_bias_forward(y, bias);
}

// BIAS_GRAD[c] (+)= sum over p of DY[c, p]; overwrites unless ACCUMULATE.
inline void channel_bias_backward(const Tensor& dy, Tensor& bias_grad, bool accumulate) {
  detail::require_disjoint("kernels::channel_bias_backward", "bias_grad must not overlap dy", dy,
                           bias_grad);
  MPT_DISPATCH_CUDA(dy, channel_bias_backward, dy, bias_grad, accumulate);
  host::channel_bias_backward(dy, bias_grad, accumulate);
}

}  // namespace mpt::kernels
