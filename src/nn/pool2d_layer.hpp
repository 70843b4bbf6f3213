// Pooling layers over NCHW samples: MaxPool2D and AvgPool2D (K x K windows every S, no padding)
// and GlobalAvgPool (the mean of each channel's plane, output (C), ready for a dense layer).
#pragma once

#include <cstdint>

#include "kernels/pool2d.hpp"
#include "nn/nn.hpp"
#include "nn/sample_staging.hpp"

namespace mpt::nn {

enum class PoolMode { max, average, global_average };

class Pool2dLayer final : public Layer {
 public:
  // INPUT_SHAPE is the per-sample (C, H, W); the caller has checked that the window fits.
  // KERNEL and STRIDE are ignored for global_average.
  Pool2dLayer(std::string name, PoolMode mode, const Shape& input_shape, std::int64_t kernel,
              std::int64_t stride);

  std::string_view kind() const override;
  std::string spec() const override;
  Shape output_shape(const Shape& input_shape) const override;
  double flops_per_sample(const Shape& input_shape) const override;
  void plan(std::int64_t max_batch, DType precision) override;
  std::int64_t scratch_bytes() const override { return staging_.scratch_bytes(); }

  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  // True when the last plan() chose cuDNN (the cuda device, cuda_conv_path() == cudnn, a build
  // with cuDNN); a batch whose x is not in the storage dtype (the model's f32 input) still
  // takes the staged path below.
  bool uses_cudnn() const { return uses_cudnn_; }

 private:
  PoolMode mode_;
  std::int64_t channels_;
  kernels::Pool2dGeometry geometry_;
  bool disjoint_ = true;  // windows that tile without overlap: 16-bit max-pool backward
  std::int64_t run_ = 1;  // samples per staged run under 16-bit storage
  SampleStaging staging_;
  bool uses_cudnn_ = false;
  DType storage_ = DType::f32;
#ifdef MPTRAIN_HAVE_CUDNN
  kernels::cuda::CudnnPool2d cudnn_;
#endif
};

}  // namespace mpt::nn
