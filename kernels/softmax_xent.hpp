// Softmax cross-entropy loss over logits, fused with its gradient. Always f32 logits with double
// accumulation of the loss, whatever the compute dtype of the model (see design.md, Precision).
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// A label that marks a row to leave out, like PyTorch's CrossEntropyLoss(ignore_index=-1): the
// row adds nothing to loss_sum or correct, and its gradient row is zero. The data reader sets it
// for samples skipped under --data.on-nonfinite=skip. The row still counts in the batch size
// the caller divides by (grad_scale), as with PyTorch's reduction='sum' divided by the batch.
inline constexpr std::int32_t kIgnoreLabel = -1;

// Sums over the rows of one batch; ranks add them up for global metrics.
struct XentStats {
  double loss_sum = 0;       // sum over rows of -log softmax(logits)[label], in nats
  std::int64_t correct = 0;  // rows whose argmax (first maximum) equals the label
};

namespace host {
XentStats softmax_xent_forward(const Tensor& logits, const Tensor& labels);
XentStats softmax_xent_forward_backward(const Tensor& logits, const Tensor& labels, Tensor& dlogits,
                                        float grad_scale);
}  // namespace host
// The CUDA twins (kernels/cuda/softmax_xent.cu), same contracts, every tensor on the cuda device.
namespace cuda {
XentStats softmax_xent_forward(const Tensor& logits, const Tensor& labels);
XentStats softmax_xent_forward_backward(const Tensor& logits, const Tensor& labels, Tensor& dlogits,
                                        float grad_scale);
}  // namespace cuda

// Loss and accuracy of LOGITS [B, C] f32 against LABELS [B] i32 in [0, C) or kIgnoreLabel (row
// left out). Stable for any logit magnitude (log-sum-exp with the row maximum subtracted). Any
// other label aborts the job, naming the row.
inline XentStats softmax_xent_forward(const Tensor& logits, const Tensor& labels) {
  MPT_DISPATCH_CUDA(logits, softmax_xent_forward, logits, labels);
  return host::softmax_xent_forward(logits, labels);
}

// As softmax_xent_forward, and also writes DLOGITS [B, C] f32 = (softmax - onehot) * grad_scale,
// the gradient of grad_scale * loss_sum (a zero row for kIgnoreLabel). The trainer passes
// 1 / global batch (times the loss scale), so that summing gradients over ranks gives the
// gradient of the mean loss.
inline XentStats softmax_xent_forward_backward(const Tensor& logits, const Tensor& labels,
                                               Tensor& dlogits, float grad_scale) {
  detail::require_disjoint("kernels::softmax_xent_forward_backward",
                           "dlogits must not overlap logits", logits, dlogits);
  detail::require_disjoint("kernels::softmax_xent_forward_backward",
                           "dlogits must not overlap labels", labels, dlogits);
  MPT_DISPATCH_CUDA(logits, softmax_xent_forward_backward, logits, labels, dlogits,
                    grad_scale);
  return host::softmax_xent_forward_backward(logits, labels, dlogits, grad_scale);
}

}  // namespace mpt::kernels
