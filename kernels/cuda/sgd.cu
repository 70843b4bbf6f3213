// CUDA SGD update (see kernels/sgd.hpp): one fused pass, with the recast of the 16-bit working
// copy in the same thread that updates the master weight. With a control state every thread
// reads the step's verdict, lr and first-step flag from it on the device.
#include "kernels/cuda/common.cuh"
#include "kernels/sgd.hpp"

namespace mpt::kernels::cuda {

void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                Tensor* rounded, Tensor* widened, const Tensor* control) {
  constexpr const char* op = "kernels::cuda::sgd_update";
  const StepState* state = control ? step_state_on_device(op, *control) : nullptr;
  require_cuda(op, "params must be f32 on the cuda device", params, DType::f32);
  require_cuda(op, "grads must be f32 on the cuda device", grads, DType::f32);
  const std::int64_t n = params.numel();
  detail::require_pair(grads.numel() == n, op,
                       "params and grads must have the same number of elements", params, grads);
  const RecastTargets recast = recast_targets(op, params, rounded, widened);
  std::uint16_t* out16 = recast.out16;
  float* out32 = recast.out32;
  const bool f16 = recast.f16;
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* buf = nullptr;
  if (momentum != 0.f) {
    require_cuda(op, "momentum_buffer must be f32 on the cuda device", momentum_buffer, DType::f32);
    detail::require_pair(momentum_buffer.numel() == n, op,
                         "params and momentum_buffer must have the same number of elements", params,
                         momentum_buffer);
    buf = momentum_buffer.data<float>();
  }
  launch_elementwise(op, n, [=] __device__(std::int64_t i) {
    float step_lr = lr;
    bool first = first_step;
    if (state) {
      if (state->skip != 0) return;
      step_lr = static_cast<float>(state->lr);
      first = state->applied_steps == 1.0;
    }
    float pi = p[i];
    const float d = g[i] + weight_decay * pi;
    if (buf) {
      const float b = first ? d : momentum * buf[i] + d;
      buf[i] = b;
      pi -= step_lr * (nesterov ? d + momentum * b : b);
    } else {
      pi -= step_lr * d;
    }
    p[i] = pi;
    if (out16) {
      const std::uint16_t bits = round16(pi, f16);
      out16[i] = bits;
      if (out32) out32[i] = widen16(bits, f16);
    }
  });
}

}  // namespace mpt::kernels::cuda
