// CUDA twins of the step-state kernels (see kernels/step_state.hpp): the mixed-precision step's
// decisions made on the device, so that the host never waits for them. Each launcher queues
// its kernels on stream() and returns; the StepState is only read and written by kernels.
#include <cmath>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/step_state.hpp"

namespace mpt::kernels::cuda {
namespace {

constexpr unsigned long long kNoRow = std::numeric_limits<unsigned long long>::max();

__global__ void begin_step_kernel(StepState* state) {
  state->loss_sum = 0;
  state->correct = 0;
  state->found_inf = 0;
  state->grad_sumsq = -1;
  state->first_bad_row = kNoRow;
  state->bad_label = 0;
}

// After one micro-batch: its first bad row (in BATCH_BAD_ROW, the scratch) goes into the state
// with its label, unless an earlier micro-batch of this step already recorded one, so that the
// row and the label always belong together.
__global__ void record_bad_label_kernel(const unsigned long long* batch_bad_row,
                                        const std::int32_t* labels, StepState* state) {
  const unsigned long long row = *batch_bad_row;
  if (row == kNoRow || state->first_bad_row != kNoRow) return;
  state->first_bad_row = row;
  state->bad_label = labels[row];
}

__global__ void poison_kernel(void* grads, int dtype_code, const StepState* state) {
  if (isfinite(state->loss_sum)) return;
  if (dtype_code == 0)
    *static_cast<std::uint32_t*>(grads) = 0x7fc00000u;  // f32 quiet NaN
  else
    *static_cast<std::uint16_t*>(grads) = dtype_code == 1 ? 0x7e00u : 0x7fc0u;  // f16, bf16
}

// One thread: the host twin's rules, the same code (decide_in_place).
__global__ void decide_kernel(StepState* state, ScaleRule rule, const double* schedule,
                              std::int64_t rows) {
  StepState s = *state;
  decide_in_place(s, rule, schedule, rows);
  *state = s;
}

// Skipped steps leave grad_sumsq as begin_step set it.
__global__ void zero_sumsq_kernel(StepState* state) {
  if (state->skip == 0) state->grad_sumsq = 0;
}

// GRADS *= float(factor) when factor = min(1, MAX_NORM / (norm + 1e-6)) is below 1; each
// thread derives the factor from the state itself.
__global__ void clip_kernel(float* grads, std::int64_t n, const StepState* state, double max_norm) {
  if (state->skip != 0) return;
  // std::min(1.0, ratio) as the host writes it.
  const double ratio = max_norm / (sqrt(state->grad_sumsq) + 1e-6);
  const double factor = ratio < 1.0 ? ratio : 1.0;
  if (!(factor < 1.0)) return;
  const float scale = static_cast<float>(factor);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    grads[i] *= scale;
}

}  // namespace

void begin_step(Tensor& state) {
  constexpr const char* op = "kernels::cuda::begin_step";
  StepState* s = step_state_on_device(op, state);
  begin_step_kernel<<<1, 1, 0, stream()>>>(s);
  check_launch(op);
}

void softmax_xent_step(const Tensor& logits, const Tensor& labels, Tensor& dlogits,
                       float grad_scale, Tensor& state) {
  constexpr const char* op = "kernels::cuda::softmax_xent_step";
  StepState* s = step_state_on_device(op, state);
  check_softmax_xent(op, logits, labels, &dlogits);
  // This micro-batch's first bad row, in the scratch (stream-ordered, like every user of it).
  auto* batch_bad_row = static_cast<unsigned long long*>(reduction_scratch());
  MPT_CHECK_CUDA(cudaMemsetAsync(batch_bad_row, 0xff, sizeof *batch_bad_row, stream()));
  XentTargets targets;
  targets.loss_sum = &s->loss_sum;
  targets.correct_sum = &s->correct;
  targets.first_bad_row = batch_bad_row;
  targets.loss_scale = &s->scale;
  launch_softmax_xent(op, logits, labels, &dlogits, grad_scale, targets);
  if (logits.dim(0) > 0) {
    record_bad_label_kernel<<<1, 1, 0, stream()>>>(batch_bad_row, labels.data<std::int32_t>(), s);
    check_launch(op);
  }
}

void poison_if_nonfinite_loss(Tensor& grads, const Tensor& state) {
  constexpr const char* op = "kernels::cuda::poison_if_nonfinite_loss";
  const StepState* s = step_state_on_device(op, state);
  detail::require(
      grads.defined() && grads.device() == Device::cuda && is_float_dtype(grads.dtype()), op,
      "grads must be f32, f16 or bf16 on the cuda device", grads);
  if (grads.numel() == 0) return;
  const int dtype_code = grads.dtype() == DType::f32 ? 0 : grads.dtype() == DType::f16 ? 1 : 2;
  poison_kernel<<<1, 1, 0, stream()>>>(grads.raw(), dtype_code, s);
  check_launch(op);
}

void unscale_and_check_step(std::span<const Tensor> inputs, std::span<Tensor> outputs,
                            Tensor& state) {
  constexpr const char* op = "kernels::cuda::unscale_and_check_step";
  StepState* s = step_state_on_device(op, state);
  static_assert(sizeof(StepState::found_inf) == sizeof(int), "found_inf is the kernel's int flag");
  check_unscale_check(op, inputs, outputs);
  launch_unscale_check(op, inputs, outputs, 0.f, &s->scale, reinterpret_cast<int*>(&s->found_inf));
}

void decide_step(Tensor& state, const ScaleRule& rule, const Tensor& schedule) {
  constexpr const char* op = "kernels::cuda::decide_step";
  StepState* s = step_state_on_device(op, state);
  require_cuda(op, "schedule must be f64 on the cuda device", schedule, DType::f64);
  detail::require(
      schedule.rank() == 2 && schedule.dim(0) > 0 && schedule.dim(1) == kScheduleColumns, op,
      "schedule must be [rows, 3] with rows > 0 (lr, bias_correction1, bias_correction2)",
      schedule);
  decide_kernel<<<1, 1, 0, stream()>>>(s, rule, schedule.data<double>(), schedule.dim(0));
  check_launch(op);
}

void clip_grad_norm(Tensor& grads, Tensor& state, double max_norm) {
  constexpr const char* op = "kernels::cuda::clip_grad_norm";
  StepState* s = step_state_on_device(op, state);
  require_cuda(op, "grads must be f32 on the cuda device", grads, DType::f32);
  const std::int64_t n = grads.numel();
  zero_sumsq_kernel<<<1, 1, 0, stream()>>>(s);
  check_launch(op);
  launch_sum_of_squares(op, grads.data<float>(), n, &s->grad_sumsq, &s->skip);
  if (max_norm > 0 && n > 0) {
    clip_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(grads.data<float>(), n, s, max_norm);
    check_launch(op);
  }
}

}  // namespace mpt::kernels::cuda
