// CUDA uint8 -> f32 normalisation (see kernels/normalize.hpp).
#include "kernels/cuda/common.cuh"
#include "kernels/normalize.hpp"

namespace mpt::kernels::cuda {

void normalize_u8(const Tensor& in, Tensor& out, float scale, float shift) {
  constexpr const char* op = "kernels::cuda::normalize_u8";
  require_cuda(op, "in must be uint8 on the cuda device", in, DType::u8);
  require_cuda(op, "out must be f32 on the cuda device", out, DType::f32);
  detail::require_pair(in.numel() == out.numel(), op,
                       "in and out must have the same number of elements", in, out);
  const std::uint8_t* source = in.data<std::uint8_t>();
  float* target = out.data<float>();
  launch_elementwise(op, in.numel(), [=] __device__(std::int64_t i) {
    target[i] = static_cast<float>(source[i]) * scale + shift;
  });
}

}  // namespace mpt::kernels::cuda
