// CUDA sum of squares in double (see kernels/norm.hpp): per-thread double sums and a fixed
// warp-shuffle and shared-memory tree per block, each block's sum into its own slot, then one
// block sums the slots in index order and adds that to the total. No atomics, so the same
// gradients give the same bits on every rank and every run: a clipped step's factor depends on
// it (an atomicAdd per block would add in whatever order the blocks finish).
// kernels::cuda::clip_grad_norm (step_state.cu) runs the same kernels into the StepState,
// gated by its skip verdict. The slots and their in-order sum (block_sums_scratch,
// launch_add_block_sums) also serve softmax_xent.cu's loss sum.
#include "core/device_memory.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/norm.hpp"

namespace mpt::kernels::cuda {
namespace {

__global__ void sum_of_squares_kernel(const float* values, std::int64_t n, double* block_sums,
                                      const std::int32_t* skip) {
  if (skip && *skip) return;  // the same answer for every thread: no one reaches the barrier
  double sum = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double v = values[i];
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = sum;
}

// One block: BLOCKS slots summed in index order (thread t takes slots t, t + 256, ...), added to
// TOTAL by one thread.
__global__ void add_block_sums_kernel(const double* block_sums, int blocks, double* total,
                                      const std::int32_t* skip) {
  if (skip && *skip) return;
  double sum = 0;
  for (int i = static_cast<int>(threadIdx.x); i < blocks; i += blockDim.x) sum += block_sums[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *total += sum;
}

}  // namespace

// A slot per block of the largest grid (blocks_for's cap), from the arena on first use (the
// first eager step, before any graph capture) and never replaced. Its users all run on
// stream(), each writing its slots before it reads them, so they share it in stream order.
double* block_sums_scratch() {
  static double* const scratch = static_cast<double*>(device_memory::allocate_cuda(
      static_cast<std::size_t>(blocks_for(std::int64_t{1} << 40)) * sizeof(double)));
  return scratch;
}

void launch_add_block_sums(const char* op, const double* block_sums, int blocks, double* total,
                           const std::int32_t* skip) {
  add_block_sums_kernel<<<1, kThreads, 0, stream()>>>(block_sums, blocks, total, skip);
  check_launch(op);
}

void launch_sum_of_squares(const char* op, const float* values, std::int64_t n, double* total,
                           const std::int32_t* skip) {
  if (n <= 0) return;
  const int blocks = blocks_for(n);
  double* block_sums = block_sums_scratch();
  sum_of_squares_kernel<<<blocks, kThreads, 0, stream()>>>(values, n, block_sums, skip);
  check_launch(op);
  launch_add_block_sums(op, block_sums, blocks, total, skip);
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
