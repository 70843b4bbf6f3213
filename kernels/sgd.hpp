// Stochastic gradient descent with momentum, weight decay and Nesterov, with exactly the update
// rule of PyTorch's torch.optim.SGD (dampening 0), over flat f32 buffers.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                Tensor* rounded, Tensor* widened, const Tensor* control);
}  // namespace host
// The CUDA twins (kernels/cuda/sgd.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                Tensor* rounded, Tensor* widened, const Tensor* control);
}  // namespace cuda

// One SGD step, in place on PARAMS and MOMENTUM_BUFFER; all three tensors are f32 with the same
// number of elements:
//   d = g + weight_decay * p
//   buf = first_step ? d : momentum * buf + d     (PyTorch creates buf as a copy of d, so the
//                                                  first step ignores the old contents of buf)
//   p -= lr * (nesterov ? d + momentum * buf : buf)
// With momentum == 0 the buffer is neither read nor written and p -= lr * d.
// With ROUNDED (f16 or bf16) and WIDENED (f32) given, each chunk of the updated PARAMS is also
// written as ROUNDED = round(p) and WIDENED = float(ROUNDED) while it is in cache: the recast
// of mixed precision (kernels::round_and_widen) fused into the update, one pass fewer over
// the FP32 masters. On the cuda device WIDENED may be null (cuBLASLt reads ROUNDED itself).
// With CONTROL (a kernels::StepState tensor on the params' device, after decide_step) the
// update reads its verdict there instead of from the host: nothing at all is written when
// skip is set, lr is float(CONTROL.lr) and first_step is CONTROL.applied_steps == 1 (LR and
// FIRST_STEP are ignored).
inline void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, float lr,
                       float momentum, float weight_decay, bool nesterov, bool first_step,
                       Tensor* rounded = nullptr, Tensor* widened = nullptr,
                       const Tensor* control = nullptr) {
  detail::require_pairwise_disjoint(
      "kernels::sgd_update", {{"params", &params}, {"grads", &grads},
                              {"momentum_buffer", &momentum_buffer}, {"rounded", rounded},
                              {"widened", widened}, {"control", control}});
  MPT_DISPATCH_CUDA(params, sgd_update, params, grads, momentum_buffer, lr, momentum, weight_decay,
                    nesterov, first_step, rounded, widened, control);
  host::sgd_update(params, grads, momentum_buffer, lr, momentum, weight_decay, nesterov,
                   first_step, rounded, widened, control);
}

}  // namespace mpt::kernels
