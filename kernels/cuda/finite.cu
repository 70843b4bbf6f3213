// CUDA finite test (see kernels/finite.hpp): any thread that sees Inf or NaN raises one flag.
#include "kernels/cuda/common.cuh"
#include "kernels/finite.hpp"

namespace mpt::kernels::cuda {

bool all_finite(const Tensor& x) {
  constexpr const char* op = "kernels::cuda::all_finite";
  detail::require(x.defined() && x.device() == Device::cuda && is_float_dtype(x.dtype()), op,
                  "x must be f32, f16 or bf16 on the cuda device", x);
  auto* flag = static_cast<int*>(reduction_scratch());
  MPT_CHECK_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), stream()));
  if (x.dtype() == DType::f32) {
    const auto* in = static_cast<const std::uint32_t*>(x.raw());
    launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) {
      if ((in[i] & 0x7f800000u) == 0x7f800000u) *flag = 1;
    });
  } else {
    const auto* in = static_cast<const std::uint16_t*>(x.raw());
    const std::uint16_t inf = x.dtype() == DType::f16 ? 0x7c00u : 0x7f80u;
    launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) {
      if ((in[i] & 0x7fffu) >= inf) *flag = 1;
    });
  }
  int bad = 0;
  read_scratch(&bad, sizeof bad);
  return bad == 0;
}

}  // namespace mpt::kernels::cuda
