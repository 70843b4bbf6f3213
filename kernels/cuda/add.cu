// CUDA elementwise add (see kernels/add.hpp): any mix of f32, f16 and bf16, summed in f32 and
// rounded once: the host kernel's result bit for bit, except a NaN's payload (the GPU has one NaN).
#include "kernels/add.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {
namespace {

// One operand as the device sees it: its storage and whether that is 16-bit (and which).
struct Operand {
  const void* data;
  bool is_16 = false, is_f16 = false;
};

Operand operand(const Tensor& t) {
  return {t.raw(), t.dtype() != DType::f32, t.dtype() == DType::f16};
}

__device__ inline float load(const Operand& x, std::int64_t i) {
  return x.is_16 ? widen16(static_cast<const std::uint16_t*>(x.data)[i], x.is_f16)
                 : static_cast<const float*>(x.data)[i];
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  constexpr const char* op = "kernels::cuda::add";
  const Tensor* const tensors[] = {&a, &b, &y};
  for (const Tensor* t : tensors)
    detail::require(t->defined() && t->device() == Device::cuda && is_float_dtype(t->dtype()), op,
                    "tensors must be f32, f16 or bf16 on the cuda device", *t);
  detail::require_pair(a.numel() == b.numel(), op, "a and b must have the same element count", a, b);
  detail::require_pair(a.numel() == y.numel(), op, "a and y must have the same element count", a, y);
  const Operand left = operand(a), right = operand(b);
  void* out = y.raw();
  const bool out_16 = y.dtype() != DType::f32, out_f16 = y.dtype() == DType::f16;
  launch_elementwise(op, a.numel(), [=] __device__(std::int64_t i) {
    const float sum = load(left, i) + load(right, i);
    if (out_16)
      static_cast<std::uint16_t*>(out)[i] = round16(sum, out_f16);
    else
      static_cast<float*>(out)[i] = sum;
  });
}

}  // namespace mpt::kernels::cuda
