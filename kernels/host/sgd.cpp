// Host SGD update (see kernels/sgd.hpp), one fused pass over parameters, gradients and buffer.
#include "kernels/sgd.hpp"

#include "kernels/host/convert.hpp"
#include "kernels/host/parallel.hpp"
#include "kernels/step_state.hpp"

namespace mpt::kernels::host {

void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step, Tensor* rounded,
                Tensor* widened, const Tensor* control) {
  static const std::string label = "kernels::sgd_update";
  constexpr const char* op = "kernels::sgd_update";
  if (control) {
    const StepState& state = detail::host_step_state(op, *control);
    if (state.skip != 0) return;
    lr = static_cast<float>(state.lr);
    first_step = state.applied_steps == 1.0;
  }
  detail::require_host_f32(op, "params must be f32 on the host", params);
  detail::require_host_f32(op, "grads must be f32 on the host", grads);
  detail::require_pair(params.numel() == grads.numel(), op,
                       "params and grads must have the same number of elements", params, grads);
  float* __restrict p = params.data<float>();
  const float* __restrict g = grads.data<float>();
  // The fused recast: null pointers when there is none.
  std::uint16_t* out16 = nullptr;
  float* out32 = nullptr;
  DType to = DType::f16;
  if (rounded || widened) {
    detail::require(
        rounded && widened && (rounded->dtype() == DType::f16 || rounded->dtype() == DType::bf16),
        op, "rounded must be f16 or bf16, given together with widened", params);
    detail::require(rounded->device() == Device::cpu, op, "rounded must be on the host", *rounded);
    detail::require_host_f32(op, "widened must be f32 on the host", *widened);
    detail::require_pair(rounded->numel() == params.numel() && widened->numel() == params.numel(),
                         op, "rounded and widened must hold as many elements as params", *rounded,
                         *widened);
    out16 = static_cast<std::uint16_t*>(rounded->raw());
    out32 = widened->data<float>();
    to = rounded->dtype();
  }
  const auto recast_chunk = [=](std::int64_t begin, std::int64_t end) {
    if (out16) round_and_widen_f32(p + begin, to, out16 + begin, out32 + begin, end - begin);
  };

  if (momentum == 0.f) {
    // PyTorch keeps no buffer without momentum; MOMENTUM_BUFFER may be undefined here.
    parallel_chunks(label, params.numel(), [=](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
      recast_chunk(begin, end);
    });
    return;
  }
  detail::require_host_f32(op, "momentum_buffer must be f32 on the host", momentum_buffer);
  detail::require_pair(params.numel() == momentum_buffer.numel(), op,
                       "params and momentum_buffer must have the same number of elements", params,
                       momentum_buffer);
  float* __restrict buf = momentum_buffer.data<float>();
  parallel_chunks(label, params.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float d = g[i] + weight_decay * p[i];
      // The old buffer is not read on the first step: it may hold anything, even NaN.
      const float b = first_step ? d : momentum * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + momentum * b : b);
    }
    recast_chunk(begin, end);
  });
}

}  // namespace mpt::kernels::host
