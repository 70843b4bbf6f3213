// 2-D convolution layer over NCHW samples: weights (C_out, C_in, K, K) and a bias, like
// PyTorch's nn.Conv2d with dilation 1 and groups 1. Lowered to im2col + matmul over blocks of
// samples, so that each pass is one large GEMM rather than one small GEMM per sample. On the
// cuda device it goes through cuDNN instead, unless CudaConvPath::im2col is chosen (nn.hpp), and
// on the host through oneDNN's convolution, unless HostConvPath::im2col is (or oneDNN declines).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/conv2d.hpp"
#include "nn/nn.hpp"
#include "nn/sample_staging.hpp"

namespace mpt::nn {

class Conv2d final : public Layer {
 public:
  // INPUT_SHAPE is the per-sample (C_in, H, W); the caller has checked that the kernel fits.
  Conv2d(std::string name, const Shape& input_shape, std::int64_t out_channels, std::int64_t kernel,
         std::int64_t stride, std::int64_t pad);

  std::string_view kind() const override { return "conv"; }
  std::string spec() const override;
  Shape output_shape(const Shape& input_shape) const override;
  double flops_per_sample(const Shape& input_shape) const override;
  std::vector<ParamSpec> param_specs() const override;
  void plan(std::int64_t max_batch, DType precision) override;
  std::int64_t scratch_bytes() const override;

  // The ReLU after the conv goes into the pass that adds the bias (forward) and into the
  // pass that reorders dy (backward, masked by the output).
  bool fuse_following_relu() override {
    fused_relu_ = true;
    return true;
  }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  // Samples per block from the next plan() on: 0 (the default) picks it from the column
  // matrix's size; tests set it to make blocks that do not divide the batch.
  void set_block_samples(std::int64_t samples) { requested_block_ = samples; }
  std::int64_t block_samples() const { return block_; }

  // True when the last plan() chose cuDNN: the cuda device, cuda_conv_path() == cudnn, a build
  // with cuDNN, and a deterministic cuDNN algorithm for each direction at this shape.
  bool uses_cudnn() const { return uses_cudnn_; }
  // The cuDNN algorithms and workspace chosen by plan(), or why cuDNN is not used.
  std::string cudnn_plan() const;
  // True when the last plan() chose oneDNN's convolution: the host, host_conv_path() ==
  // onednn, the oneDNN matmul backend, and a dtype oneDNN computes natively here.
  bool uses_dnnl() const { return uses_dnnl_; }
  // oneDNN's kernels chosen by plan(), or why oneDNN is not used.
  std::string dnnl_plan() const;

 private:
  bool plan_cudnn(std::int64_t max_batch, DType precision);
  bool plan_dnnl(std::int64_t max_batch, DType precision);
  // The model's workspace holds the 16-bit working weights (where the matmul takes 16 bits).
  bool has_working_weights() const;
  // The weight in the storage dtype: the f32 compute copy, or its 16-bit working twin.
  const Tensor& storage_weight(const char* caller);

  kernels::Conv2dGeometry geometry_;
  std::int64_t out_channels_;
  std::int64_t requested_block_ = 0, block_ = 0;
  bool fused_relu_ = false;
  Tensor col_;   // f32 [C_in*K*K, block*OH*OW]: a block's windows, later their gradients
  Tensor rows_;  // f32 [C_out, block*OH*OW]: the block's output, or its dy, channel-major
  Tensor weight_grad_, bias_grad_;  // f32 sums over the batch when the gradients are 16-bit
  // Where the matmul takes the 16-bit storage dtype (the model's workspace holds the working
  // weights: the cuda device, or bf16 on a host with bf16 dot products), the GEMMs take 16-bit
  // operands: the windows in col16_, dy's channel rows in rows16_ (exact: dy is 16-bit), and
  // an f32 input (the model's first layer) rounded into x16_ on the way, as cuDNN does.
  bool takes_16_ = false;
  Tensor col16_, rows16_, x16_;
  Tensor col16_block_, rows16_block_, x16_run_;
  SampleStaging staging_;
  // Views re-pointed per block.
  Tensor weight_2d_, weight_grad_2d_, col_block_, rows_block_, output_run_, input_run_;
  // X's samples [FIRST, FIRST + COUNT) in the storage dtype, for the 16-bit GEMM path.
  const Tensor& input_16(const Tensor& x, std::int64_t first, std::int64_t count);
  // im2col of X's samples [FIRST, FIRST + COUNT): into col16_ on the 16-bit path, else into
  // col_ (widened through the staging); the block's column matrix, a view.
  const Tensor& unfold(const Tensor& x, std::int64_t first, std::int64_t count);
  // The cuDNN path: forward, backward data, filter and bias through one plan.
  bool uses_cudnn_ = false;
  // The host's library path: the same through oneDNN.
  bool uses_dnnl_ = false;
  kernels::host::DnnlConv2d dnnl_;
  DType storage_ = DType::f32;
  Tensor weight16_;  // view of the model's 16-bit working copy (nn/workspace.hpp)
#ifdef MPTRAIN_HAVE_CUDNN
  kernels::cuda::CudnnConv2d cudnn_;
#endif
};

}  // namespace mpt::nn
