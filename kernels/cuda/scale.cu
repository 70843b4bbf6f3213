// CUDA in-place scaling (see kernels/scale.hpp).
#include "kernels/cuda/common.cuh"
#include "kernels/scale.hpp"

namespace mpt::kernels::cuda {

void scale_inplace(Tensor& x, float factor) {
  constexpr const char* op = "kernels::cuda::scale_inplace";
  require_cuda(op, "x must be f32 on the cuda device", x, DType::f32);
  float* values = x.data<float>();
  launch_elementwise(op, x.numel(), [=] __device__(std::int64_t i) { values[i] *= factor; });
}

}  // namespace mpt::kernels::cuda
