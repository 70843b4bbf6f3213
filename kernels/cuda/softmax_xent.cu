// CUDA softmax cross-entropy (see kernels/softmax_xent.hpp): one warp per row. The row maximum
// (first maximum on ties, as torch.argmax), the exp sum in double and the gradient follow the
// host's arithmetic; the loss sums meet in double in a fixed order (no atomics: the same bits on
// every run), the hits in integer atomics. The kernel also serves
// kernels::cuda::softmax_xent_step (step_state.cu), which sends its sums into the StepState.
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/softmax_xent.hpp"

namespace mpt::kernels::cuda {
namespace {

struct Totals {
  double loss_sum;
  unsigned long long correct;
  unsigned long long first_bad_row;
};

constexpr int kRowsPerBlock = kThreads / 32;

// One row, by the 32 lanes of a warp: its gradient into DX (when not null) and, in lane 0, its
// loss into *LOSS and its hit into *HITS. A bad label's row gets a zero gradient and goes into
// FIRST_BAD_ROW, an ignored one only the zero gradient.
__device__ void xent_row(const float* x, float* dx, std::int32_t label, std::int64_t row,
                         std::int64_t classes, float grad_scale, int lane,
                         unsigned long long* first_bad_row, double* loss,
                         unsigned long long* hits) {
  if (label < 0 || label >= classes) {
    if (label != kIgnoreLabel && lane == 0)
      atomicMin(first_bad_row, static_cast<unsigned long long>(row));
    if (dx)
      for (std::int64_t j = lane; j < classes; j += 32) dx[j] = 0.f;
    return;
  }
  float max_logit = -INFINITY;
  std::int64_t argmax = classes;
  // This lane's first maximum. As on the host, which starts from x[0] and moves on only to a
  // greater value, a NaN past column 0 never wins; a NaN in column 0 wins the row (below).
  for (std::int64_t j = lane; j < classes; j += 32) {
    const float v = x[j];
    if (v > max_logit || (argmax == classes && !isnan(v))) {
      max_logit = v;
      argmax = j;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(0xffffffffu, max_logit, offset);
    const std::int64_t other_arg = __shfl_down_sync(0xffffffffu, argmax, offset);
    if (other_arg < classes &&
        (argmax == classes || other > max_logit || (other == max_logit && other_arg < argmax))) {
      max_logit = other;
      argmax = other_arg;
    }
  }
  max_logit = __shfl_sync(0xffffffffu, max_logit, 0);
  argmax = __shfl_sync(0xffffffffu, argmax, 0);
  if (isnan(x[0])) {
    max_logit = x[0];
    argmax = 0;
  }
  double exp_sum = 0;
  for (std::int64_t j = lane; j < classes; j += 32) {
    const float e = expf(x[j] - max_logit);
    if (dx) dx[j] = e;
    exp_sum += e;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    exp_sum += __shfl_down_sync(0xffffffffu, exp_sum, offset);
  exp_sum = __shfl_sync(0xffffffffu, exp_sum, 0);
  if (dx) {
    const float factor = static_cast<float>(grad_scale / exp_sum);
    for (std::int64_t j = lane; j < classes; j += 32) {
      const float g = __fmul_rn(dx[j], factor);  // rounded before the subtraction, as on the host
      dx[j] = j == label ? g - grad_scale : g;
    }
  }
  if (lane == 0) {
    *loss += static_cast<double>(max_logit) + log(exp_sum) - static_cast<double>(x[label]);
    if (argmax == label) ++*hits;
  }
}

// A grid-stride loop over rows, a warp per row. Each warp adds its rows' losses in row order,
// the block adds its warps' sums in warp order into its slot of BLOCK_SUMS, and
// launch_add_block_sums adds the slots in index order: a sum in an order fixed by the batch
// size and the device, so the same logits give the same loss bits on every run (an atomicAdd
// per row would add in whatever order the warps finish). Hits are integers: one atomic add
// per warp, exact in any order.
__global__ void xent_kernel(const float* logits, const std::int32_t* labels, float* dlogits,
                            std::int64_t rows, std::int64_t classes, float grad_scale,
                            XentTargets targets, double* block_sums) {
  // The step's loss scale is read here, on the device; __fmul_rn keeps the f32 product from
  // being fused into the gradient's subtraction below, so it is rounded as on the host.
  if (targets.loss_scale)
    grad_scale = __fmul_rn(grad_scale, static_cast<float>(*targets.loss_scale));
  const int lane = threadIdx.x % 32;
  double loss = 0;
  unsigned long long hits = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
       row < rows; row += stride)
    xent_row(logits + row * classes, dlogits ? dlogits + row * classes : nullptr, labels[row], row,
             classes, grad_scale, lane, targets.first_bad_row, &loss, &hits);
  if (lane == 0 && hits > 0) {
    if (targets.correct_count)
      atomicAdd(targets.correct_count, hits);
    else
      atomicAdd(targets.correct_sum, static_cast<double>(hits));  // an integer: exact
  }
  // Only lane 0 of each warp holds a loss; block_sum adds them in warp order.
  loss = block_sum(lane == 0 ? loss : 0.0);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = loss;
}

XentStats run(const char* op, const Tensor& logits, const Tensor& labels, Tensor* dlogits,
              float grad_scale) {
  static_assert(sizeof(Totals) <= 256, "Totals must fit the reduction scratch");
  check_softmax_xent(op, logits, labels, dlogits);
  auto* totals = static_cast<Totals*>(reduction_scratch());
  const Totals start{0.0, 0ull, std::numeric_limits<unsigned long long>::max()};
  MPT_CHECK_CUDA(cudaMemcpyAsync(totals, &start, sizeof start, cudaMemcpyHostToDevice, stream()));
  XentTargets targets;
  targets.loss_sum = &totals->loss_sum;
  targets.correct_count = &totals->correct;
  targets.first_bad_row = &totals->first_bad_row;
  launch_softmax_xent(op, logits, labels, dlogits, grad_scale, targets);
  Totals result{};
  read_scratch(&result, sizeof result);
  if (result.first_bad_row != std::numeric_limits<unsigned long long>::max()) {
    const auto row = static_cast<std::int64_t>(result.first_bad_row);
    std::int32_t label = 0;
    MPT_CHECK_CUDA(cudaMemcpy(&label, labels.data<std::int32_t>() + row, sizeof label,
                              cudaMemcpyDeviceToHost));
    abort_job(std::string(op) + ": label " + std::to_string(label) + " of row " +
              std::to_string(row) + " is outside [0, " + std::to_string(logits.dim(1)) + ")");
  }
  return XentStats{result.loss_sum, static_cast<std::int64_t>(result.correct)};
}

}  // namespace

void check_softmax_xent(const char* op, const Tensor& logits, const Tensor& labels,
                        const Tensor* dlogits) {
  require_cuda(op, "logits must be f32 on the cuda device", logits, DType::f32);
  detail::require(logits.rank() == 2 && logits.dim(1) > 0, op,
                  "logits must be [batch, classes] with classes > 0", logits);
  require_cuda(op, "labels must be 1-D int32 on the cuda device", labels, DType::i32);
  detail::require(labels.rank() == 1, op, "labels must be 1-D int32 on the cuda device", labels);
  detail::require_pair(labels.dim(0) == logits.dim(0), op,
                       "labels must have one entry per row of logits", logits, labels);
  if (dlogits) {
    require_cuda(op, "dlogits must be f32 on the cuda device", *dlogits, DType::f32);
    detail::require_pair(dlogits->shape() == logits.shape(), op,
                         "dlogits must have the shape of logits", logits, *dlogits);
  }
}

void launch_softmax_xent(const char* op, const Tensor& logits, const Tensor& labels,
                         Tensor* dlogits, float grad_scale, const XentTargets& targets) {
  const std::int64_t rows = logits.dim(0);
  if (rows <= 0) return;
  // A block per kRowsPerBlock rows, up to blocks_for's cap (then each warp takes several rows).
  const int blocks = blocks_for(rows * 32);
  double* block_sums = block_sums_scratch();
  xent_kernel<<<blocks, kThreads, 0, stream()>>>(logits.data<float>(), labels.data<std::int32_t>(),
                                                 dlogits ? dlogits->data<float>() : nullptr, rows,
                                                 logits.dim(1), grad_scale, targets, block_sums);
  check_launch(op);
  launch_add_block_sums(op, block_sums, blocks, targets.loss_sum, nullptr);
}

XentStats softmax_xent_forward(const Tensor& logits, const Tensor& labels) {
  return run("kernels::cuda::softmax_xent_forward", logits, labels, nullptr, 0.f);
}

XentStats softmax_xent_forward_backward(const Tensor& logits, const Tensor& labels, Tensor& dlogits,
                                        float grad_scale) {
  return run("kernels::cuda::softmax_xent_forward_backward", logits, labels, &dlogits, grad_scale);
}

}  // namespace mpt::kernels::cuda
