// Fully connected layer, Y = X·Wᵀ + b with W stored (out, in) like PyTorch's nn.Linear. X and Y
// may be f32 or 16-bit; the arithmetic is f32. 16-bit operands go to the matmul as they are where
// it takes them (cuBLASLt; oneDNN for bf16 on AMX or AVX512-BF16), else are widened to f32.
#pragma once

#include <cstdint>

#include "nn/nn.hpp"

namespace mpt::nn {

class Dense final : public Layer {
 public:
  Dense(std::string name, std::int64_t in_features, std::int64_t out_features);

  std::string_view kind() const override { return "dense"; }
  std::string spec() const override;
  Shape output_shape(const Shape& input_shape) const override;
  double flops_per_sample(const Shape& input_shape) const override;
  std::vector<ParamSpec> param_specs() const override;
  void plan(std::int64_t max_batch, DType precision) override;
  std::int64_t scratch_bytes() const override;

  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }

 private:
  // Under a GradsReady hook (f32 on the host, a weight of more than one block): dW in blocks
  // of output rows, last block first, each reported final as soon as it is written.
  void weight_grad_in_row_blocks(const Tensor& x, const Tensor& dy);
  std::int64_t report_block_rows() const;
  // The 16-bit paths: blocks of rows through the f32 workspace.
  void forward_in_blocks(const Tensor& x, Tensor& y);
  void backward_in_blocks(const Tensor& x, const Tensor& dy, Tensor* dx);
  ComputeWorkspace& workspace(const char* caller) const;
  // The paths for 16-bit X (and DY) where the matmul takes them (ComputeWorkspace::
  // working_params defined: cuBLASLt, or oneDNN's bf16 on the host): the 16-bit operands go
  // straight to the matmul with f32 accumulation; only the bias works in f32.
  bool takes_16(const Tensor& x) const;
  // ROWS rows of X from ROW on in the working dtype: a view, or an f32 X rounded into the
  // workspace's input16.
  const Tensor& input_rows_16(const Tensor& x, std::int64_t row, std::int64_t rows,
                              const ComputeWorkspace& ws);
  void forward_16(const Tensor& x, Tensor& y);
  void backward_16(const Tensor& x, const Tensor& dy, Tensor* dx);
  // This layer's weight in the 16-bit working copy (a view, re-pointed in W16_).
  const Tensor& working_weight(const ComputeWorkspace& ws);
  // ROWS rows of SRC [b, COLUMNS] from ROW on, as f32: a view of SRC when it is f32, else
  // widened into SCRATCH. ROWS_VIEW and WIDENED_VIEW are re-pointed (no allocation).
  static const Tensor& rows_as_f32(const Tensor& src, std::int64_t row, std::int64_t rows,
                                   std::int64_t columns, const Tensor& scratch, Tensor& rows_view,
                                   Tensor& widened_view);

  std::int64_t in_features_;
  std::int64_t out_features_;
  // Views re-pointed for every block, kept so the step does not allocate their shapes.
  Tensor x_rows_, x_widened_, y_rows_, y_widened_, dx_rows_, weight_grad_, bias_grad_, w16_,
      x16_rows_;
  // One block of dyᵀ [block rows, max batch] f32, planned only where weight_grad_in_row_blocks
  // can run, and its view.
  Tensor dy_transposed_, dy_t_rows_;
};

}  // namespace mpt::nn
