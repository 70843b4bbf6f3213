// CUDA bias add over the feature axis, forward and backward (see kernels/bias.hpp).
#include <algorithm>

#include "kernels/bias.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {
namespace {
void check_shapes(const char* op, const Tensor& activation, const Tensor& bias) {
  require_cuda(op, "the activation must be f32 on the cuda device", activation, DType::f32);
  require_cuda(op, "the bias must be f32 on the cuda device", bias, DType::f32);
  detail::require(activation.rank() == 2, op, "the activation must be [batch, features]",
                  activation);
  detail::require(bias.rank() == 1, op, "the bias must be 1-D [features]", bias);
  detail::require_pair(activation.dim(1) == bias.dim(0), op,
                       "the activation's feature count must equal the bias length", activation,
                       bias);
}
}  // namespace

void bias_add_forward(Tensor& y, const Tensor& bias) {
  constexpr const char* op = "kernels::cuda::bias_add_forward";
  check_shapes(op, y, bias);
  const std::int64_t features = y.dim(1);
  float* out = y.data<float>();
  const float* b = bias.data<float>();
  launch_channel_elementwise(op, y.numel(), 1, features,
                             [=] __device__(std::int64_t i, std::int64_t c) { out[i] += b[c]; });
}

// The column sum runs in two passes. One thread per column walking all rows (the first
// version) gave 4 blocks for 1024 features: 0.94 ms for a batch of 8192 on an H200, two thirds
// of the mlp step (ncu, docs/gpu.md). Pass 1: blocks of 32 columns x 8 row lanes each sum one
// chunk of rows into a partial row; pass 2: one thread per column adds the partial rows in a
// fixed order, so the result does not depend on scheduling.
namespace {
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;
constexpr std::int64_t kMaxChunks = 256;     // partial rows; gridDim.y limit is 65535
constexpr std::int64_t kRowsPerBlock = 64;   // below this, fewer chunks

__global__ void column_partial_sums(const float* dy, std::int64_t batch, std::int64_t features,
                                    std::int64_t rows_per_chunk, float* partial) {
  __shared__ float lanes[kRowLanes][kColumnTile + 1];  // +1: no bank conflicts on the sum
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const std::int64_t row_begin = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t row_end = min(batch, row_begin + rows_per_chunk);
  float sum = 0.f;
  if (column < features)
    for (std::int64_t row = row_begin + threadIdx.y; row < row_end; row += kRowLanes)
      sum += dy[row * features + column];
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < features) {
    float total = 0.f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += lanes[lane][threadIdx.x];
    partial[blockIdx.y * features + column] = total;
  }
}

// Device scratch for the partial rows, grown on first use and kept, so that a steady-state
// step allocates nothing.
float* partial_rows(std::size_t floats) {
  static float* scratch = nullptr;
  static std::size_t capacity = 0;
  if (floats > capacity) {
    if (scratch != nullptr) device_memory::note_scratch_replaced();
    device_memory::free_cuda(scratch);  // the arena's blocks: no cudaMalloc once it holds them
    scratch = static_cast<float*>(device_memory::allocate_cuda(floats * sizeof(float)));
    capacity = floats;
  }
  return scratch;
}
}  // namespace

void bias_add_backward(const Tensor& dy, Tensor& dbias, bool accumulate) {
  constexpr const char* op = "kernels::cuda::bias_add_backward";
  check_shapes(op, dy, dbias);
  const std::int64_t batch = dy.dim(0), features = dy.dim(1);
  float* grad_bias = dbias.data<float>();
  if (features == 0) return;
  if (batch == 0) {
    if (!accumulate) MPT_CHECK_CUDA(cudaMemsetAsync(grad_bias, 0, dbias.size_bytes(), stream()));
    return;
  }
  const std::int64_t chunks =
      std::min(kMaxChunks, std::max<std::int64_t>(1, (batch + kRowsPerBlock - 1) / kRowsPerBlock));
  const std::int64_t rows_per_chunk = (batch + chunks - 1) / chunks;
  float* partial = partial_rows(static_cast<std::size_t>(chunks * features));
  const dim3 grid(static_cast<unsigned>((features + kColumnTile - 1) / kColumnTile),
                  static_cast<unsigned>(chunks));
  column_partial_sums<<<grid, dim3(kColumnTile, kRowLanes), 0, stream()>>>(
      dy.data<float>(), batch, features, rows_per_chunk, partial);
  check_launch(op);
  launch_elementwise(op, features, [=] __device__(std::int64_t j) {
    float sum = accumulate ? grad_bias[j] : 0.f;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partial[chunk * features + j];
    grad_bias[j] = sum;
  });
}

}  // namespace mpt::kernels::cuda
