// CUDA sum of squares in double (see kernels/norm.hpp): per-thread double sums, a warp-shuffle
// and shared-memory tree per block, and one atomicAdd per block.
#include "kernels/cuda/common.cuh"
#include "kernels/norm.hpp"

namespace mpt::kernels::cuda {
namespace {

__global__ void sum_of_squares_kernel(const float* values, std::int64_t n, double* total) {
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

double sum_of_squares(const Tensor& x) {
  constexpr const char* op = "kernels::cuda::sum_of_squares";
  require_cuda(op, "x must be f32 on the cuda device", x, DType::f32);
  if (x.numel() <= 0) return 0;
  auto* total = static_cast<double*>(reduction_scratch());
  MPT_CHECK_CUDA(cudaMemsetAsync(total, 0, sizeof(double), stream()));
  sum_of_squares_kernel<<<blocks_for(x.numel()), kThreads, 0, stream()>>>(x.data<float>(),
                                                                          x.numel(), total);
  check_launch(op);
  double result = 0;
  read_scratch(&result, sizeof result);
  return result;
}

}  // namespace mpt::kernels::cuda
