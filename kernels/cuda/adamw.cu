// CUDA AdamW update (see kernels/adamw.hpp): the host's float expressions, fused with the
// recast of the 16-bit working copy. With a control state every thread derives the step's
// scalars from it on the device, with the host's expressions.
#include <cmath>

#include "kernels/adamw.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {

void adamw_update(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const Tensor* decay_mask, const AdamwStep& step, Tensor* rounded,
                  Tensor* widened, const Tensor* control) {
  constexpr const char* op = "kernels::cuda::adamw_update";
  const StepState* state = control ? step_state_on_device(op, *control) : nullptr;
  require_cuda(op, "params must be f32 on the cuda device", params, DType::f32);
  require_cuda(op, "grads must be f32 on the cuda device", grads, DType::f32);
  require_cuda(op, "exp_avg must be f32 on the cuda device", exp_avg, DType::f32);
  require_cuda(op, "exp_avg_sq must be f32 on the cuda device", exp_avg_sq, DType::f32);
  const std::int64_t n = params.numel();
  detail::require_pair(grads.numel() == n, op,
                       "params and grads must have the same number of elements", params, grads);
  detail::require_pair(exp_avg.numel() == n && exp_avg_sq.numel() == n, op,
                       "exp_avg and exp_avg_sq must hold as many elements as params", exp_avg,
                       exp_avg_sq);
  const std::uint8_t* mask = nullptr;
  if (decay_mask) {
    detail::require(decay_mask->defined() && decay_mask->dtype() == DType::u8 &&
                        decay_mask->numel() == n && decay_mask->device() == Device::cuda,
                    op, "decay_mask must be u8 on the cuda device with as many elements as params",
                    *decay_mask);
    mask = decay_mask->data<std::uint8_t>();
  }
  const RecastTargets recast = recast_targets(op, params, rounded, widened);
  std::uint16_t* out16 = recast.out16;
  float* out32 = recast.out32;
  const bool f16 = recast.f16;
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const float weight_decay = step.weight_decay;
  const float beta1 = step.beta1, beta2 = step.beta2, eps = step.eps;
  const float given_decay = 1.f - step.lr * step.weight_decay;
  const float given_step_size = static_cast<float>(step.lr / step.bias_correction1);
  const float given_sqrt_bc2 = static_cast<float>(std::sqrt(step.bias_correction2));
  launch_elementwise(op, n, [=] __device__(std::int64_t i) {
    float decay = given_decay, step_size = given_step_size, sqrt_bc2 = given_sqrt_bc2;
    if (state) {
      if (state->skip != 0) return;
      // The host's expressions; __fmul_rn and __fsub_rn keep 1 - lr * wd from becoming an FMA,
      // which the host does not use.
      const float lr = static_cast<float>(state->lr);
      decay = __fsub_rn(1.f, __fmul_rn(lr, weight_decay));
      step_size = static_cast<float>(static_cast<double>(lr) / state->bias_correction1);
      sqrt_bc2 = static_cast<float>(sqrt(state->bias_correction2));
    }
    const float gi = g[i];
    float pi = (mask == nullptr || mask[i]) ? p[i] * decay : p[i];
    const float mi = beta1 * m[i] + (1.f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    pi -= step_size * mi / (sqrtf(vi) / sqrt_bc2 + eps);
    p[i] = pi;
    if (out16) {
      const std::uint16_t bits = round16(pi, f16);
      out16[i] = bits;
      if (out32) out32[i] = widen16(bits, f16);
    }
  });
}

}  // namespace mpt::kernels::cuda
