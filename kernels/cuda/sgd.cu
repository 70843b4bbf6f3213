// CUDA SGD update (see kernels/sgd.hpp): one fused pass, with the recast of the 16-bit working
// copy in the same thread that updates the master weight.
#include "kernels/cuda/common.cuh"
#include "kernels/sgd.hpp"

namespace mpt::kernels::cuda {

void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                Tensor* rounded, Tensor* widened) {
  constexpr const char* op = "kernels::cuda::sgd_update";
  require_cuda(op, "params must be f32 on the cuda device", params, DType::f32);
  require_cuda(op, "grads must be f32 on the cuda device", grads, DType::f32);
  const std::int64_t n = params.numel();
  detail::require_pair(grads.numel() == n, op,
                       "params and grads must have the same number of elements", params, grads);
  // On the device the f32 WIDENED copy is optional: cuBLASLt reads the 16-bit copy directly.
  std::uint16_t* out16 = nullptr;
  float* out32 = nullptr;
  bool f16 = true;
  if (rounded) {
    detail::require(rounded->defined() && rounded->device() == Device::cuda &&
                        (rounded->dtype() == DType::f16 || rounded->dtype() == DType::bf16) &&
                        rounded->numel() == n,
                    op, "rounded must be f16 or bf16 on the cuda device, as long as params",
                    *rounded);
    out16 = static_cast<std::uint16_t*>(rounded->raw());
    f16 = rounded->dtype() == DType::f16;
  }
  if (widened) {
    detail::require(rounded != nullptr, op, "widened needs rounded", *widened);
    require_cuda(op, "widened must be f32 on the cuda device", *widened, DType::f32);
    detail::require_pair(widened->numel() == n, op, "widened must hold as many elements as params",
                         params, *widened);
    out32 = widened->data<float>();
  }
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
    float pi = p[i];
    const float d = g[i] + weight_decay * pi;
    if (buf) {
      const float b = first_step ? d : momentum * buf[i] + d;
      buf[i] = b;
      pi -= lr * (nesterov ? d + momentum * b : b);
    } else {
      pi -= lr * d;
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
