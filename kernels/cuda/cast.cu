// CUDA casts between f32, f16 and bf16 (see kernels/cast.hpp), with the host's rounding.
#include "kernels/cast.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {

void cast(const Tensor& src, Tensor& dst) {
  constexpr const char* op = "kernels::cuda::cast";
  detail::require(src.defined() && src.device() == Device::cuda && is_float_dtype(src.dtype()), op,
                  "src must be f32, f16 or bf16 on the cuda device", src);
  detail::require(dst.defined() && dst.device() == Device::cuda && is_float_dtype(dst.dtype()), op,
                  "dst must be f32, f16 or bf16 on the cuda device", dst);
  detail::require_pair(src.numel() == dst.numel(), op,
                       "src and dst must have the same number of elements", src, dst);
  const DType from = src.dtype(), to = dst.dtype();
  const std::int64_t n = src.numel();
  if (from == to) {
    if (src.raw() != dst.raw())
      MPT_CHECK_CUDA(cudaMemcpyAsync(dst.raw(), src.raw(), src.size_bytes(),
                                     cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  if (from == DType::f32) {
    const float* in = static_cast<const float*>(src.raw());
    auto* out = static_cast<std::uint16_t*>(dst.raw());
    const bool f16 = to == DType::f16;
    launch_elementwise(op, n, [=] __device__(std::int64_t i) { out[i] = round16(in[i], f16); });
    return;
  }
  const auto* in = static_cast<const std::uint16_t*>(src.raw());
  const bool from_f16 = from == DType::f16;
  if (to == DType::f32) {
    float* out = static_cast<float*>(dst.raw());
    launch_elementwise(op, n, [=] __device__(std::int64_t i) { out[i] = widen16(in[i], from_f16); });
    return;
  }
  auto* out = static_cast<std::uint16_t*>(dst.raw());  // f16 <-> bf16 through f32
  const bool to_f16 = to == DType::f16;
  launch_elementwise(op, n, [=] __device__(std::int64_t i) {
    out[i] = round16(widen16(in[i], from_f16), to_f16);
  });
}

void round_and_widen(const Tensor& src, Tensor& rounded, Tensor& widened) {
  constexpr const char* op = "kernels::cuda::round_and_widen";
  require_cuda(op, "src must be f32 on the cuda device", src, DType::f32);
  detail::require(rounded.defined() && rounded.device() == Device::cuda &&
                      (rounded.dtype() == DType::f16 || rounded.dtype() == DType::bf16),
                  op, "rounded must be f16 or bf16 on the cuda device", rounded);
  require_cuda(op, "widened must be f32 on the cuda device", widened, DType::f32);
  detail::require_pair(rounded.numel() == src.numel() && widened.numel() == src.numel(), op,
                       "rounded and widened must hold as many elements as src", rounded, widened);
  const float* in = src.data<float>();
  auto* out16 = static_cast<std::uint16_t*>(rounded.raw());
  float* out32 = widened.data<float>();
  const bool f16 = rounded.dtype() == DType::f16;
  launch_elementwise(op, src.numel(), [=] __device__(std::int64_t i) {
    const std::uint16_t bits = round16(in[i], f16);
    out16[i] = bits;
    out32[i] = widen16(bits, f16);
  });
}

}  // namespace mpt::kernels::cuda
