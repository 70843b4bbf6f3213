// AdamW (Adam with decoupled weight decay), with exactly the update rule of PyTorch's
// torch.optim.AdamW (amsgrad off), over flat f32 buffers with an optional per-element decay mask.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// Scalars of one AdamW step. The bias corrections are computed by the caller in double from the
// step count t (1-based): bias_correction1 = 1 - beta1^t, bias_correction2 = 1 - beta2^t.
struct AdamwStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  double bias_correction1 = 1;
  double bias_correction2 = 1;
};

namespace host {
void adamw_update(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const Tensor* decay_mask, const AdamwStep& step, Tensor* rounded,
                  Tensor* widened, const Tensor* control);
}  // namespace host
// The CUDA twins (kernels/cuda/adamw.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void adamw_update(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const Tensor* decay_mask, const AdamwStep& step, Tensor* rounded,
                  Tensor* widened, const Tensor* control);
}  // namespace cuda

// One AdamW step, in place on PARAMS, EXP_AVG (m) and EXP_AVG_SQ (v); all f32 with the same
// number of elements:
//   p *= 1 - lr * weight_decay * mask           (decoupled decay; mask 1 everywhere if null)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / bias_correction1) * m / (sqrt(v) / sqrt(bias_correction2) + eps)
// DECAY_MASK, when given, is u8 (0: no decay for this element, e.g. a bias). ROUNDED and WIDENED
// are the fused recast of mixed precision, as in kernels::sgd_update (WIDENED may be null on
// the cuda device). With CONTROL (a kernels::StepState tensor on the params' device, after
// decide_step) the update reads its verdict there: nothing at all is written when skip is set,
// and lr = float(CONTROL.lr), bias_correction1/2 = CONTROL's replace STEP's.
inline void adamw_update(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                         const Tensor* decay_mask, const AdamwStep& step, Tensor* rounded = nullptr,
                         Tensor* widened = nullptr, const Tensor* control = nullptr) {
  detail::require_pairwise_disjoint(
      "kernels::adamw_update", {{"params", &params}, {"grads", &grads}, {"exp_avg", &exp_avg},
                                {"exp_avg_sq", &exp_avg_sq}, {"decay_mask", decay_mask},
                                {"rounded", rounded}, {"widened", widened}, {"control", control}});
  MPT_DISPATCH_CUDA(params, adamw_update, params, grads, exp_avg, exp_avg_sq, decay_mask, step,
                    rounded, widened, control);
  host::adamw_update(params, grads, exp_avg, exp_avg_sq, decay_mask, step, rounded, widened,
                     control);
}

}  // namespace mpt::kernels
