// Host AdamW update (see kernels/adamw.hpp), one fused pass over parameters, gradients, m and v.
#include "kernels/adamw.hpp"

#include <cmath>

#include "kernels/host/convert.hpp"
#include "kernels/host/parallel.hpp"
#include "kernels/step_state.hpp"

namespace mpt::kernels::host {

void adamw_update(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                  const Tensor* decay_mask, const AdamwStep& given, Tensor* rounded,
                  Tensor* widened, const Tensor* control) {
  static const std::string label = "kernels::adamw_update";
  constexpr const char* op = "kernels::adamw_update";
  AdamwStep step = given;
  if (control) {
    const StepState& state = detail::host_step_state(op, *control);
    if (state.skip != 0) return;
    step.lr = static_cast<float>(state.lr);
    step.bias_correction1 = state.bias_correction1;
    step.bias_correction2 = state.bias_correction2;
  }
  detail::require_host_f32(op, "params must be f32 on the host", params);
  detail::require_host_f32(op, "grads must be f32 on the host", grads);
  detail::require_host_f32(op, "exp_avg must be f32 on the host", exp_avg);
  detail::require_host_f32(op, "exp_avg_sq must be f32 on the host", exp_avg_sq);
  const std::int64_t n = params.numel();
  detail::require_pair(grads.numel() == n, op,
                       "params and grads must have the same number of elements", params, grads);
  detail::require_pair(exp_avg.numel() == n && exp_avg_sq.numel() == n, op,
                       "exp_avg and exp_avg_sq must hold as many elements as params", exp_avg,
                       exp_avg_sq);
  const std::uint8_t* mask = nullptr;
  if (decay_mask) {
    detail::require(decay_mask->defined() && decay_mask->dtype() == DType::u8 &&
                        decay_mask->numel() == n && decay_mask->device() == Device::cpu,
                    op, "decay_mask must be u8 on the host with as many elements as params",
                    *decay_mask);
    mask = decay_mask->data<std::uint8_t>();
  }
  std::uint16_t* out16 = nullptr;
  float* out32 = nullptr;
  DType to = DType::f16;
  if (rounded || widened) {
    detail::require(
        rounded && widened && (rounded->dtype() == DType::f16 || rounded->dtype() == DType::bf16),
        op, "rounded must be f16 or bf16, given together with widened", params);
    detail::require(rounded->device() == Device::cpu, op, "rounded must be on the host", *rounded);
    detail::require_host_f32(op, "widened must be f32 on the host", *widened);
    detail::require_pair(rounded->numel() == n && widened->numel() == n, op,
                         "rounded and widened must hold as many elements as params", *rounded,
                         *widened);
    out16 = static_cast<std::uint16_t*>(rounded->raw());
    out32 = widened->data<float>();
    to = rounded->dtype();
  }

  float* __restrict p = params.data<float>();
  const float* __restrict g = grads.data<float>();
  float* __restrict m = exp_avg.data<float>();
  float* __restrict v = exp_avg_sq.data<float>();
  // The same float expressions as torch.optim.AdamW's single-tensor path (step_size, the
  // denominator with sqrt(bias_correction2)), so that a replay in PyTorch matches to rounding.
  const float decay = 1.f - step.lr * step.weight_decay;
  const float beta1 = step.beta1, beta2 = step.beta2, eps = step.eps;
  const float step_size = static_cast<float>(step.lr / step.bias_correction1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(step.bias_correction2));
  parallel_chunks(label, n, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float gi = g[i];
      float pi = (mask == nullptr || mask[i]) ? p[i] * decay : p[i];
      const float mi = beta1 * m[i] + (1.f - beta1) * gi;
      const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      pi -= step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);
      p[i] = pi;
    }
    if (out16) round_and_widen_f32(p + begin, to, out16 + begin, out32 + begin, end - begin);
  });
}

}  // namespace mpt::kernels::host
