// The training step's state on the gradients' device: the dynamic loss scale and its counters,
// the step's overflow flag and skip verdict, the learning rate and bias corrections of its
// update, and its loss sums. Every decision of a mixed-precision step is a kernel over it, so
// a step on the GPU needs no host synchronisation: the loss scale is read by the loss kernel,
// the verdict by the optimizer kernels, and the host reads a copy once the step is done (on
// cuda one step later, asynchronously). On the host the same kernels run, so the CPU tests
// check the logic that the GPU runs.
//
// One step, in order:
//   begin_step            zero the step's sums and flags
//   softmax_xent_step     per micro-batch: dlogits scaled by the state's loss scale, sums added
//   poison_if_nonfinite_loss   a rank whose loss is not finite writes a NaN into its gradients,
//                         which the all-reduce carries to every rank (before the all-reduce)
//   unscale_and_check_step     the reduced gradients into the f32 masters, times 1/scale;
//                         raises found_inf
//   decide_step           the loss scaler's update (amp::LossScaler's rules), the skip verdict,
//                         this update's lr and bias corrections from the schedule table
//   clip_grad_norm        by global norm, unless skipped
//   sgd_update / adamw_update with the state (kernels/sgd.hpp, adamw.hpp): nothing when skipped
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// Lives in a u8 tensor of sizeof(StepState) bytes (step_state_tensor), on the host or the cuda
// device. Counters are doubles (exact to 2^53) so that the struct has one layout on both sides.
struct StepState {
  // The loss scaler (amp::LossScalerState).
  double scale = 1;
  double growth_tracker = 0;
  double hysteresis_tracker = 1;
  double skipped_steps = 0;
  // Optimizer updates applied in total, and when this run started (the schedule table's row 0).
  double applied_steps = 0;
  double applied_at_start = 0;
  // Written by the step.
  double loss_sum = 0;  // over this step's micro-batches on this rank (NaN or Inf: non-finite)
  double correct = 0;
  double grad_sumsq = -1;  // clip_grad_norm: the unscaled gradients' sum of squares (-1: none)
  double lr = 0;           // the schedule row of this step's update (skipped: the next one's)
  double bias_correction1 = 1;
  double bias_correction2 = 1;
  double old_scale = 1;                 // the scale this step's loss was multiplied by
  std::uint64_t first_bad_row = ~0ull;  // softmax_xent_step on cuda: a label outside [0, C)
  std::int32_t bad_label = 0;           // ... and that label
  std::int32_t found_inf = 0;           // a non-finite gradient after the all-reduce
  std::int32_t skip = 0;                // this step's update is skipped
  std::int32_t failed_at_min_scale = 0;  // an overflow at min-scale with fail_at_min_scale
};

// The loss scaler's rules (amp::LossScalerOptions) as decide_step applies them.
struct ScaleRule {
  bool dynamic = true;  // false: the scale never moves (fp32, bf16, a static scale); overflow still skips
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  double min_scale = 1.0;
  double max_scale = 16777216.0;
  std::int64_t growth_interval = 2000;
  std::int64_t hysteresis = 1;
  bool fail_at_min_scale = false;  // raise failed_at_min_scale instead of backing off at min-scale
};

#if defined(__CUDACC__)
#define MPT_HOST_DEVICE __host__ __device__
#else
#define MPT_HOST_DEVICE
#endif

// Columns of the schedule table: an f64 tensor [rows, 3]; row k belongs to the update that
// follows applied_at_start + k applied updates (the last row serves every later one).
inline constexpr int kScheduleLr = 0, kScheduleBias1 = 1, kScheduleBias2 = 2, kScheduleColumns = 3;

// decide_step's rules (below) on S, for both twins: the host kernel and the CUDA kernel's one
// thread run this same code, so they take the same decisions bit for bit. SCHEDULE: the
// table's ROWS x kScheduleColumns doubles.
MPT_HOST_DEVICE inline void decide_in_place(StepState& s, const ScaleRule& rule,
                                            const double* schedule, std::int64_t rows) {
  s.old_scale = s.scale;
  const bool found = s.found_inf != 0;
  s.skip = found ? 1 : 0;
  if (found) s.skipped_steps += 1;
  if (rule.dynamic) {
    if (!found) {
      s.growth_tracker += 1;
      if (s.growth_tracker >= static_cast<double>(rule.growth_interval)) {
        s.growth_tracker = 0;
        s.hysteresis_tracker = static_cast<double>(rule.hysteresis);
        const double grown = s.scale * rule.growth_factor;
        s.scale = grown < rule.max_scale ? grown : rule.max_scale;
      }
    } else if (rule.fail_at_min_scale && s.scale <= rule.min_scale) {
      s.failed_at_min_scale = 1;  // the scale and the trackers stay; the reader stops the run
    } else {
      s.growth_tracker = 0;
      // As in Megatron-LM, the tracker is refilled only by growth: once HYSTERESIS overflows
      // were tolerated, every further overflow backs off until the scale grows again.
      s.hysteresis_tracker -= 1;
      if (s.hysteresis_tracker <= 0) {
        s.hysteresis_tracker = 0;
        const double backed = s.scale * rule.backoff_factor;
        s.scale = backed > rule.min_scale ? backed : rule.min_scale;
      }
    }
  }
  const double last = static_cast<double>(rows - 1);
  const double k = s.applied_steps - s.applied_at_start;
  const double row = k < 0.0 ? 0.0 : (k > last ? last : k);
  const double* entry = schedule + static_cast<std::int64_t>(row) * kScheduleColumns;
  s.lr = entry[kScheduleLr];
  s.bias_correction1 = entry[kScheduleBias1];
  s.bias_correction2 = entry[kScheduleBias2];
  if (!found) s.applied_steps += 1;
}

// A u8 tensor on DEVICE holding INIT (a synchronous copy; setup only).
Tensor step_state_tensor(const StepState& init, Device device);
// A synchronous copy of STATE (tests, restores; the trainer reads asynchronously).
StepState read_step_state(const Tensor& state);
// Overwrites STATE with VALUE (a synchronous copy; setup and restore only).
void write_step_state(Tensor& state, const StepState& value);

namespace detail {
// The StepState in a host tensor, validated (u8 on the host, sizeof(StepState) bytes); aborts
// naming OP otherwise.
StepState& host_step_state(const char* op, const Tensor& state);
}  // namespace detail

namespace host {
void begin_step(Tensor& state);
void softmax_xent_step(const Tensor& logits, const Tensor& labels, Tensor& dlogits, float grad_scale,
                       Tensor& state);
void poison_if_nonfinite_loss(Tensor& grads, const Tensor& state);
void unscale_and_check_step(std::span<const Tensor> inputs, std::span<Tensor> outputs, Tensor& state);
void decide_step(Tensor& state, const ScaleRule& rule, const Tensor& schedule);
void clip_grad_norm(Tensor& grads, Tensor& state, double max_norm);
}  // namespace host
// The CUDA twins (kernels/cuda/step_state.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void begin_step(Tensor& state);
void softmax_xent_step(const Tensor& logits, const Tensor& labels, Tensor& dlogits, float grad_scale,
                       Tensor& state);
void poison_if_nonfinite_loss(Tensor& grads, const Tensor& state);
void unscale_and_check_step(std::span<const Tensor> inputs, std::span<Tensor> outputs, Tensor& state);
void decide_step(Tensor& state, const ScaleRule& rule, const Tensor& schedule);
void clip_grad_norm(Tensor& grads, Tensor& state, double max_norm);
}  // namespace cuda

// Zeroes loss_sum, correct and found_inf, sets grad_sumsq to -1 and clears the bad label.
inline void begin_step(Tensor& state) {
  MPT_DISPATCH_CUDA(state, begin_step, state);
  host::begin_step(state);
}

// kernels::softmax_xent_forward_backward with the gradient scale GRAD_SCALE * float(scale), the
// product in f32 (the loss scale read from STATE, not from the host), and the batch's loss and
// correct count added to STATE. A label outside [0, C) (other than kIgnoreLabel) aborts the job
// on the host; on cuda it is recorded in first_bad_row and bad_label for the reader of the
// state to report (the kernel cannot stop the job).
inline void softmax_xent_step(const Tensor& logits, const Tensor& labels, Tensor& dlogits,
                              float grad_scale, Tensor& state) {
  detail::require_disjoint("kernels::softmax_xent_step", "dlogits must not overlap logits",
                           logits, dlogits);
  detail::require_disjoint("kernels::softmax_xent_step", "dlogits must not overlap labels",
                           labels, dlogits);
  detail::require_disjoint("kernels::softmax_xent_step", "state must not overlap dlogits",
                           dlogits, state);
  MPT_DISPATCH_CUDA(logits, softmax_xent_step, logits, labels, dlogits, grad_scale, state);
  host::softmax_xent_step(logits, labels, dlogits, grad_scale, state);
}

// When STATE's loss_sum is not finite, writes a NaN into element 0 of GRADS (f32, f16 or bf16).
inline void poison_if_nonfinite_loss(Tensor& grads, const Tensor& state) {
  MPT_DISPATCH_CUDA(grads, poison_if_nonfinite_loss, grads, state);
  host::poison_if_nonfinite_loss(grads, state);
}

// kernels::unscale_and_check with INV_SCALE = float(1 / scale) from STATE; a non-finite input
// sets found_inf (never clears it).
inline void unscale_and_check_step(std::span<const Tensor> inputs, std::span<Tensor> outputs,
                                   Tensor& state) {
  MPT_DISPATCH_CUDA(state, unscale_and_check_step, inputs, outputs, state);
  host::unscale_and_check_step(inputs, outputs, state);
}

// One thread of decisions, after unscale_and_check_step:
//   old_scale = scale; skip = found_inf; skipped_steps += skip
//   with RULE.dynamic: amp::LossScaler::update's growth, hysteresis and backoff (a clean step
//     grows the scale after growth_interval of them; an overflow backs off once hysteresis is
//     used up); an overflow at scale <= min_scale with fail_at_min_scale sets
//     failed_at_min_scale and leaves the scale and trackers as they were
//   k = clamp(applied_steps - applied_at_start, 0, rows - 1)
//   lr, bias_correction1, bias_correction2 = SCHEDULE[k]
//   applied_steps += !skip
inline void decide_step(Tensor& state, const ScaleRule& rule, const Tensor& schedule) {
  MPT_DISPATCH_CUDA(state, decide_step, state, rule, schedule);
  host::decide_step(state, rule, schedule);
}

// optim::clip_by_global_norm on the device's terms: unless STATE's skip is set, grad_sumsq =
// sum of squares of GRADS (f32, in double), and with MAX_NORM > 0 GRADS *= float(factor) where
// factor = min(1, MAX_NORM / (sqrt(grad_sumsq) + 1e-6)) is below 1.
inline void clip_grad_norm(Tensor& grads, Tensor& state, double max_norm) {
  MPT_DISPATCH_CUDA(grads, clip_grad_norm, grads, state, max_norm);
  host::clip_grad_norm(grads, state, max_norm);
}

}  // namespace mpt::kernels
