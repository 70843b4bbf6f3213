// Host twins of the step-state kernels (see kernels/step_state.hpp), and the state's copies in
// and out. decide_step's rules are decide_in_place, shared with the CUDA twin.
#include "kernels/step_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "kernels/copy.hpp"
#include "kernels/norm.hpp"
#include "kernels/scale.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/unscale_check.hpp"

namespace mpt::kernels {

Tensor step_state_tensor(const StepState& init, Device device) {
  Tensor host({static_cast<std::int64_t>(sizeof(StepState))}, DType::u8);
  std::memcpy(host.raw(), &init, sizeof init);
  return device == Device::cpu ? host : host.to(device);
}

StepState read_step_state(const Tensor& state) {
  detail::require(state.defined() && state.dtype() == DType::u8 &&
                      state.numel() == static_cast<std::int64_t>(sizeof(StepState)),
                  "kernels::read_step_state", "the state must be u8 with sizeof(StepState) bytes",
                  state);
  StepState value;
  device_memory::copy(&value, Device::cpu, state.raw(), state.device(), sizeof value);
  return value;
}

void write_step_state(Tensor& state, const StepState& value) {
  detail::require(state.defined() && state.dtype() == DType::u8 &&
                      state.numel() == static_cast<std::int64_t>(sizeof(StepState)),
                  "kernels::write_step_state", "the state must be u8 with sizeof(StepState) bytes",
                  state);
  device_memory::copy(state.raw(), state.device(), &value, Device::cpu, sizeof value);
}

namespace detail {

StepState& host_step_state(const char* op, const Tensor& state) {
  require(state.defined() && state.dtype() == DType::u8 && state.device() == Device::cpu &&
              state.numel() == static_cast<std::int64_t>(sizeof(StepState)),
          op, "the step state must be u8 on the host with sizeof(StepState) bytes", state);
  return *static_cast<StepState*>(const_cast<void*>(state.raw()));
}

}  // namespace detail

namespace host {

void begin_step(Tensor& state) {
  StepState& s = detail::host_step_state("kernels::begin_step", state);
  s.loss_sum = 0;
  s.correct = 0;
  s.found_inf = 0;
  s.grad_sumsq = -1;
  s.first_bad_row = ~0ull;
  s.bad_label = 0;
}

void softmax_xent_step(const Tensor& logits, const Tensor& labels, Tensor& dlogits, float grad_scale,
                       Tensor& state) {
  StepState& s = detail::host_step_state("kernels::softmax_xent_step", state);
  // The product in f32, as the trainer formed it before the scale lived in the state.
  const XentStats stats = host::softmax_xent_forward_backward(
      logits, labels, dlogits, grad_scale * static_cast<float>(s.scale));
  s.loss_sum += stats.loss_sum;
  s.correct += static_cast<double>(stats.correct);
}

void poison_if_nonfinite_loss(Tensor& grads, const Tensor& state) {
  constexpr const char* op = "kernels::poison_if_nonfinite_loss";
  const StepState& s = detail::host_step_state(op, state);
  detail::require(grads.defined() && grads.device() == Device::cpu &&
                      (grads.dtype() == DType::f32 || grads.dtype() == DType::f16 ||
                       grads.dtype() == DType::bf16),
                  op, "grads must be f32, f16 or bf16 on the host", grads);
  if (std::isfinite(s.loss_sum) || grads.numel() == 0) return;
  if (grads.dtype() == DType::f32) {
    grads.data<float>()[0] = std::nanf("");
  } else {
    const std::uint16_t nan = grads.dtype() == DType::f16 ? 0x7e00u : 0x7fc0u;
    std::memcpy(grads.raw(), &nan, sizeof nan);
  }
}

void unscale_and_check_step(std::span<const Tensor> inputs, std::span<Tensor> outputs, Tensor& state) {
  StepState& s = detail::host_step_state("kernels::unscale_and_check_step", state);
  const bool finite = host::unscale_and_check(inputs, outputs, static_cast<float>(1.0 / s.scale));
  if (!finite) s.found_inf = 1;
}

void decide_step(Tensor& state, const ScaleRule& rule, const Tensor& schedule) {
  constexpr const char* op = "kernels::decide_step";
  StepState& s = detail::host_step_state(op, state);
  detail::require(schedule.defined() && schedule.dtype() == DType::f64 &&
                      schedule.device() == Device::cpu && schedule.rank() == 2 &&
                      schedule.dim(0) > 0 && schedule.dim(1) == kScheduleColumns,
                  op, "the schedule must be f64 [rows > 0, 3] on the host", schedule);
  decide_in_place(s, rule, schedule.data<double>(), schedule.dim(0));
}

void clip_grad_norm(Tensor& grads, Tensor& state, double max_norm) {
  StepState& s = detail::host_step_state("kernels::clip_grad_norm", state);
  if (s.skip != 0) return;
  s.grad_sumsq = host::sum_of_squares(grads);
  // optim::clip_by_global_norm's expression: PyTorch's 1e-6, and no multiply by a factor of 1.
  const double factor = std::min(1.0, max_norm / (std::sqrt(s.grad_sumsq) + 1e-6));
  if (max_norm > 0 && factor < 1.0) host::scale_inplace(grads, static_cast<float>(factor));
}

}  // namespace host
}  // namespace mpt::kernels
