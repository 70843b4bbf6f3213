// CUDA sum of squares in double (see kernels/norm.hpp): per-thread double sums, a warp-shuffle
// and shared-memory tree per block, and one atomicAdd per block. kernels::cuda::clip_grad_norm
// (step_state.cu) runs the same kernel into the StepState, gated by its skip verdict.
#include "kernels/cuda/common.cuh"
#include "kernels/norm.hpp"

namespace mpt::kernels::cuda {
namespace {

__global__ void sum_of_squares_kernel(const float* values, std::int64_t n, double* total,
                                      const std::int32_t* skip) {
  if (skip && *skip) return;  // the same answer for every thread: no one reaches the barrier
  double sum = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double v = values[i];
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ double warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < kThreads / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) atomicAdd(total, sum);
  }
}

}  // namespace

void launch_sum_of_squares(const char* op, const float* values, std::int64_t n, double* total,
                           const std::int32_t* skip) {
  if (n <= 0) return;
  sum_of_squares_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(values, n, total, skip);
  check_launch(op);
}

double sum_of_squares(const Tensor& x) {
  constexpr const char* op = "kernels::cuda::sum_of_squares";
  require_cuda(op, "x must be f32 on the cuda device", x, DType::f32);
  if (x.numel() <= 0) return 0;
  auto* total = static_cast<double*>(reduction_scratch());
  MPT_CHECK_CUDA(cudaMemsetAsync(total, 0, sizeof(double), stream()));
  launch_sum_of_squares(op, x.data<float>(), x.numel(), total, nullptr);
  double result = 0;
  read_scratch(&result, sizeof result);
  return result;
}

}  // namespace mpt::kernels::cuda
