// Dense layer: forward and backward through the matmul and bias kernels. Under 16-bit storage
// the batch is processed in blocks of rows. Where the matmul takes the 16-bit operands (the
// model's workspace holds the working weights), they go to it as they are; elsewhere each
// block is widened into the model's f32 workspace, multiplied in f32 and rounded back, so the
// f32 scratch never holds a whole batch.
#include "nn/dense.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "kernels/bias.hpp"
#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"
#include "kernels/transpose.hpp"
#include "nn/workspace.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kWeight = 0, kBias = 1;
// Weight-gradient rows per reported block: about 1 MiB of f32, the size of the buckets that
// overlap best here (docs/perf.md), so a bucket cut inside the weight waits for at most about
// one block more than it must. The extra matmul calls cost little at that size.
constexpr std::int64_t kReportBlockBytes = 1 << 20;
}  // namespace

Dense::Dense(std::string name, std::int64_t in_features, std::int64_t out_features)
    : Layer(std::move(name)), in_features_(in_features), out_features_(out_features) {
  if (in_features <= 0 || out_features <= 0)
    abort_job("nn::Dense: feature counts must be positive, got in=" + std::to_string(in_features) +
              " out=" + std::to_string(out_features));
}

std::string Dense::spec() const { return "dense:" + std::to_string(out_features_); }

Shape Dense::output_shape(const Shape& input_shape) const {
  if (shape_numel(input_shape) != in_features_)
    abort_job("nn::Dense " + name() + ": expects " + std::to_string(in_features_) +
              " input features, got sample shape " + shape_to_string(input_shape));
  return {out_features_};
}

double Dense::flops_per_sample(const Shape&) const {
  // A multiply-add per weight, plus the bias add.
  return 2.0 * static_cast<double>(in_features_) * static_cast<double>(out_features_) +
         static_cast<double>(out_features_);
}

std::vector<ParamSpec> Dense::param_specs() const {
  // nn.Linear's reset_parameters: kaiming_uniform_(a=sqrt(5)) on the weight reduces to
  // U(-1/sqrt(in), 1/sqrt(in)), and the bias uses the same bound.
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_features_)));
  return {{"weight", {out_features_, in_features_}, bound}, {"bias", {out_features_}, bound}};
}

std::int64_t Dense::report_block_rows() const {
  const std::int64_t bytes =
      in_features_ * out_features_ * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t blocks = std::clamp<std::int64_t>(
      (bytes + kReportBlockBytes - 1) / kReportBlockBytes, 1, out_features_);
  return (out_features_ + blocks - 1) / blocks;  // even blocks; the first rows' may be short
}

void Dense::plan(std::int64_t max_batch, DType precision) {
  // Only the f32 host path reports in blocks (the 16-bit paths already walk the batch in
  // blocks, summing dW over them, so no row of dW is final before the end), and only a weight
  // of more than one block gains from it.
  const bool blocks = precision == DType::f32 && param_value(kWeight).device() == Device::cpu &&
                      report_block_rows() < out_features_;
  dy_transposed_ = blocks ? Tensor({report_block_rows() * max_batch}, DType::f32) : Tensor();
}

std::int64_t Dense::scratch_bytes() const {
  return dy_transposed_.defined() ? static_cast<std::int64_t>(dy_transposed_.size_bytes()) : 0;
}

void Dense::forward(const Tensor& x, Tensor& y, bool) {
  if (takes_16(x)) return forward_16(x, y);
  if (x.dtype() != DType::f32 || y.dtype() != DType::f32) return forward_in_blocks(x, y);
  // y[b, out] = x[b, in] · W[out, in]ᵀ, then + bias. A sum post-op could fold the bias into the
  // matmul, but the separate pass over a [b, out] tile is cheap next to the matmul.
  kernels::matmul(x, false, param_value(kWeight), true, y);
  kernels::bias_add_forward(y, param_value(kBias));
}

void Dense::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (takes_16(x) && workspace_->working_params.dtype() == dy.dtype())
    return backward_16(x, dy, dx);
  if (x.dtype() != DType::f32 || dy.dtype() != DType::f32 ||
      param_grad(kWeight).dtype() != DType::f32 || (dx && dx->dtype() != DType::f32))
    return backward_in_blocks(x, dy, dx);
  // dW[out, in] = dyᵀ[out, b] · x[b, in]; db = column sums of dy; dx[b, in] = dy · W. dW and db
  // come first and are reported final before dx, so their all-reduce overlaps dx's matmul.
  if (context_ && context_->wants_grads_reports() && dy_transposed_.defined()) {
    weight_grad_in_row_blocks(x, dy);
  } else {
    kernels::matmul(dy, true, x, false, param_grad(kWeight));
    kernels::bias_add_backward(dy, param_grad(kBias));
  }
  if (context_) context_->report_grads_ready(this, 0);
  if (dx) kernels::matmul(dy, false, param_value(kWeight), false, *dx);
}

void Dense::weight_grad_in_row_blocks(const Tensor& x, const Tensor& dy) {
  // The bias follows the weight in grads(), and a report covers everything after its offset:
  // db is written first, so that each block's report below is true.
  kernels::bias_add_backward(dy, param_grad(kBias));
  // dW's rows [r0, r1) need dy's columns [r0, r1) as a contiguous operand: transposed per
  // block into a scratch of one block's rows (a whole dyᵀ would add a quarter to the f32 MLP's
  // activation memory at large batches).
  const std::int64_t batch = dy.dim(0);
  const std::int64_t block = report_block_rows();
  for (std::int64_t end = out_features_; end > 0; end -= block) {
    const std::int64_t begin = std::max<std::int64_t>(0, end - block);
    Tensor::view_into(dy_t_rows_, dy_transposed_, 0, {end - begin, batch});
    kernels::transpose_columns(dy, begin, dy_t_rows_);
    Tensor::view_into(weight_grad_, param_grad(kWeight), begin * in_features_,
                      {end - begin, in_features_});
    // Each element is the same length-b dot product as in the one-matmul path; only the
    // library's blocking of it may differ (results within fp32 rounding, tests/nn/test_model).
    kernels::matmul(dy_t_rows_, false, x, false, weight_grad_);
    context_->report_grads_ready(this, begin * in_features_);
  }
}

ComputeWorkspace& Dense::workspace(const char* caller) const {
  if (!workspace_)
    abort_job("nn::Dense::" + std::string(caller) + " " + name() +
              ": 16-bit tensors need the model's workspace (plan() a mixed-precision model)");
  return *workspace_;
}

const Tensor& Dense::rows_as_f32(const Tensor& src, std::int64_t row, std::int64_t rows,
                                 std::int64_t columns, const Tensor& scratch, Tensor& rows_view,
                                 Tensor& widened_view) {
  Tensor::view_into(rows_view, src, row * columns, {rows, columns});
  if (src.dtype() == DType::f32) return rows_view;
  Tensor::view_into(widened_view, scratch, 0, {rows, columns});
  kernels::cast(rows_view, widened_view);
  return widened_view;
}

void Dense::forward_in_blocks(const Tensor& x, Tensor& y) {
  const ComputeWorkspace& ws = workspace("forward");
  const std::int64_t batch = x.dim(0);
  for (std::int64_t row = 0; row < batch; row += ws.block_rows) {
    const std::int64_t rows = std::min(ws.block_rows, batch - row);
    const Tensor& x_f32 =
        rows_as_f32(x, row, rows, in_features_, ws.input_rows, x_rows_, x_widened_);
    // An f32 output (the logits) is written in place; a 16-bit one goes through the scratch.
    Tensor::view_into(y_rows_, y, row * out_features_, {rows, out_features_});
    Tensor* y_f32 = &y_rows_;
    if (y.dtype() != DType::f32) {
      Tensor::view_into(y_widened_, ws.output_rows, 0, {rows, out_features_});
      y_f32 = &y_widened_;
    }
    kernels::matmul(x_f32, false, param_value(kWeight), true, *y_f32);
    kernels::bias_add_forward(*y_f32, param_value(kBias));
    if (y_f32 != &y_rows_) kernels::cast(*y_f32, y_rows_);
  }
}

void Dense::backward_in_blocks(const Tensor& x, const Tensor& dy, Tensor* dx) {
  // No early reports here: dW is a sum over the batch's blocks, final only after the last one
  // (Model::backward reports the layer when it returns).
  const ComputeWorkspace& ws = workspace("backward");
  const std::int64_t batch = x.dim(0);
  // dW and db are summed over the blocks in f32 and rounded to the gradient dtype once.
  Tensor::view_into(weight_grad_, ws.weight_grad, 0, {out_features_, in_features_});
  Tensor::view_into(bias_grad_, ws.bias_grad, 0, {out_features_});
  for (std::int64_t row = 0; row < batch; row += ws.block_rows) {
    const std::int64_t rows = std::min(ws.block_rows, batch - row);
    const bool first = row == 0;
    const Tensor& x_f32 =
        rows_as_f32(x, row, rows, in_features_, ws.input_rows, x_rows_, x_widened_);
    const Tensor& dy_f32 =
        rows_as_f32(dy, row, rows, out_features_, ws.output_rows, y_rows_, y_widened_);
    kernels::matmul(dy_f32, true, x_f32, false, weight_grad_, first ? 0.f : 1.f);
    kernels::bias_add_backward(dy_f32, bias_grad_, /*accumulate=*/!first);
    if (!dx) continue;
    // x's rows are used up, so dx's f32 rows can take their place in the input scratch.
    Tensor::view_into(dx_rows_, *dx, row * in_features_, {rows, in_features_});
    Tensor* dx_f32 = &dx_rows_;
    if (dx->dtype() != DType::f32) {
      Tensor::view_into(x_widened_, ws.input_rows, 0, {rows, in_features_});
      dx_f32 = &x_widened_;
    }
    kernels::matmul(dy_f32, false, param_value(kWeight), false, *dx_f32);
    if (dx_f32 != &dx_rows_) kernels::cast(*dx_f32, dx_rows_);
  }
  kernels::cast(weight_grad_, param_grad(kWeight));
  kernels::cast(bias_grad_, param_grad(kBias));
}

bool Dense::takes_16(const Tensor& x) const {
  // An f32 X is the model's input (a dense first layer): rounded to the working dtype on the
  // way, as autocast and the conv layers' 16-bit path do, so that the layer with the most
  // weights of an MLP does not fall back to f32 GEMMs.
  if (!workspace_ || !workspace_->working_params.defined()) return false;
  return x.dtype() == workspace_->working_params.dtype() || x.dtype() == DType::f32;
}

const Tensor& Dense::input_rows_16(const Tensor& x, std::int64_t row, std::int64_t rows,
                                   const ComputeWorkspace& ws) {
  Tensor::view_into(x_rows_, x, row * in_features_, {rows, in_features_});
  if (x.dtype() == ws.working_params.dtype()) return x_rows_;
  Tensor::view_into(x16_rows_, ws.input16, 0, {rows, in_features_});
  kernels::cast(x_rows_, x16_rows_);
  return x16_rows_;
}

const Tensor& Dense::working_weight(const ComputeWorkspace& ws) {
  const Tensor& weight = param_value(kWeight);  // a view of the f32 compute copy
  const auto offset = static_cast<std::int64_t>(
      (static_cast<const std::byte*>(weight.raw()) -
       static_cast<const std::byte*>(ws.compute_params.raw())) / sizeof(float));
  Tensor::view_into(w16_, ws.working_params, offset, {out_features_, in_features_});
  return w16_;
}

void Dense::forward_16(const Tensor& x, Tensor& y) {
  ComputeWorkspace& ws = workspace("forward");
  const Tensor& weight = working_weight(ws);
  const std::int64_t batch = x.dim(0);
  for (std::int64_t row = 0; row < batch; row += ws.block_rows) {
    const std::int64_t rows = std::min(ws.block_rows, batch - row);
    const Tensor& x_rows = input_rows_16(x, row, rows, ws);
    Tensor::view_into(y_rows_, y, row * out_features_, {rows, out_features_});
    Tensor* y_f32 = &y_rows_;  // the f32 logits directly; a 16-bit y after the bias, rounded
    if (y.dtype() != DType::f32) {
      Tensor::view_into(y_widened_, ws.output_rows, 0, {rows, out_features_});
      y_f32 = &y_widened_;
    }
    kernels::matmul(x_rows, false, weight, true, *y_f32);
    kernels::bias_add_forward(*y_f32, param_value(kBias));
    if (y_f32 != &y_rows_) kernels::cast(*y_f32, y_rows_);
  }
}

void Dense::backward_16(const Tensor& x, const Tensor& dy, Tensor* dx) {
  ComputeWorkspace& ws = workspace("backward");
  const Tensor& weight = working_weight(ws);
  const std::int64_t batch = x.dim(0);
  // dW is summed over the blocks in f32 and rounded once. A batch of one block (the usual case:
  // 512 rows on the host, the whole batch on the device) has one sum, which the library rounds
  // into the 16-bit gradient itself: the same rounding, without the f32 scratch's write, read
  // and recast over the whole weight.
  const bool one_block = batch <= ws.block_rows;
  Tensor::view_into(weight_grad_, one_block ? param_grad(kWeight) : ws.weight_grad, 0,
                    {out_features_, in_features_});
  Tensor::view_into(bias_grad_, ws.bias_grad, 0, {out_features_});
  for (std::int64_t row = 0; row < batch; row += ws.block_rows) {
    const std::int64_t rows = std::min(ws.block_rows, batch - row);
    const bool first = row == 0;
    const Tensor& x_rows = input_rows_16(x, row, rows, ws);
    Tensor::view_into(y_rows_, dy, row * out_features_, {rows, out_features_});
    kernels::matmul(y_rows_, true, x_rows, false, weight_grad_, first ? 0.f : 1.f);
    // The bias sums need f32 rows of dy: widened into the scratch (out_features wide).
    Tensor::view_into(y_widened_, ws.output_rows, 0, {rows, out_features_});
    kernels::cast(y_rows_, y_widened_);
    kernels::bias_add_backward(y_widened_, bias_grad_, /*accumulate=*/!first);
    if (!dx) continue;
    Tensor::view_into(dx_rows_, *dx, row * in_features_, {rows, in_features_});
    kernels::matmul(y_rows_, false, weight, false, dx_rows_);  // 16-bit C: rounded by the library
  }
  if (batch == 0) {  // no block ran: the gradients of no samples are zeros
    weight_grad_.zero();
    bias_grad_.zero();
  }
  if (!one_block) kernels::cast(weight_grad_, param_grad(kWeight));
  kernels::cast(bias_grad_, param_grad(kBias));
}

}  // namespace mpt::nn
