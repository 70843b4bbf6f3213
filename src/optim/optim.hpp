// Optimizers over the model's flat parameter and gradient buffers (SGD, AdamW), behind one
// interface, and the learning-rate schedules that drive them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.hpp"

namespace mpt::optim {

// One named optimizer state tensor (FP32, as many elements as the parameters), for checkpoints.
struct StateTensor {
  std::string name;  // e.g. "momentum_buffer", "exp_avg", "exp_avg_sq"
  Tensor value;
};

// An optimizer updates the FP32 master parameters in place from the FP32 master gradients, both
// flat views it shares with the model. steps() counts applied updates, not training steps: a
// step skipped for a gradient overflow never reaches the optimizer.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate LR (the schedule's value for steps()).
  virtual void step(float lr) = 0;
  // One update whose verdict, learning rate and step count are read on the device from CONTROL
  // (a kernels::StepState after kernels::decide_step: nothing happens when it skips), with no
  // host synchronisation. steps() does not move: the caller sets it from the state it reads
  // back (set_steps), once the step is done.
  virtual void step(const Tensor& control) = 0;
  // The optimizer state that a checkpoint must carry to resume bit for bit (none for plain SGD).
  virtual std::vector<StateTensor> state() = 0;
  // Mixed precision: every step also writes ROUNDED = round(params) (f16/bf16) and WIDENED =
  // float(ROUNDED), fused into the update (the model's working and compute copies).
  void recast_into(Tensor rounded, Tensor widened) {
    rounded_ = std::move(rounded);
    widened_ = std::move(widened);
  }
  std::int64_t steps() const { return steps_; }
  // For a checkpoint restore: with steps > 0 the next step continues the restored state.
  void set_steps(std::int64_t steps) { steps_ = steps; }

 protected:
  Tensor rounded_, widened_;  // undefined: no fused recast
  std::int64_t steps_ = 0;
};

struct SgdOptions {
  float lr = 0.05f;  // base learning rate; the schedule passes the current one to step()
  float momentum = 0.9f;
  float weight_decay = 0.f;  // L2, added to the gradient as in PyTorch (not decoupled)
  bool nesterov = false;
};

// Throws UserError naming the --optimizer.* option when OPTIONS are out of range, with the
// same rules as torch.optim.SGD (lr, momentum, weight decay >= 0; Nesterov needs momentum > 0).
void validate(const SgdOptions& options);

// torch.optim.SGD (dampening 0) over one flat buffer. PARAMS and GRADS are f32 tensors with the
// same number of elements; they are views the optimizer shares with the model.
class Sgd final : public Optimizer {
 public:
  // Validates OPTIONS and allocates the momentum buffer (zero) when momentum > 0.
  Sgd(Tensor params, Tensor grads, SgdOptions options);

  // One update with learning rate LR from grads(). The first step after construction (steps()
  // == 0) starts the momentum buffer from the gradient, as PyTorch does.
  void step(float lr) override;
  void step(const Tensor& control) override;
  std::vector<StateTensor> state() override;

  // Undefined when momentum == 0 (PyTorch keeps no buffer then).
  Tensor& momentum_buffer() { return momentum_buffer_; }
  const SgdOptions& options() const { return options_; }

 private:
  Tensor params_, grads_, momentum_buffer_;
  SgdOptions options_;
};

struct AdamwOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;  // decoupled: p *= 1 - lr * weight_decay, before the Adam update
};

// Throws UserError naming the --optimizer.* option when OPTIONS are out of range (the rules of
// torch.optim.AdamW: 0 <= beta < 1, eps > 0, weight decay >= 0).
void validate(const AdamwOptions& options);

// torch.optim.AdamW (amsgrad off) over one flat buffer, with FP32 states m and v and bias
// correction. DECAY_MASK (u8, one per parameter, 1: decay) lets biases and norms go undecayed;
// an undefined mask decays every element.
class AdamW final : public Optimizer {
 public:
  // Validates OPTIONS and allocates m and v (zero).
  AdamW(Tensor params, Tensor grads, AdamwOptions options, Tensor decay_mask = Tensor());

  // One update with learning rate LR; the bias corrections use t = steps() + 1.
  void step(float lr) override;
  void step(const Tensor& control) override;
  std::vector<StateTensor> state() override;

  Tensor& exp_avg() { return exp_avg_; }
  Tensor& exp_avg_sq() { return exp_avg_sq_; }
  const AdamwOptions& options() const { return options_; }

 private:
  Tensor params_, grads_, exp_avg_, exp_avg_sq_, decay_mask_;
  AdamwOptions options_;
};

// Where one named parameter sits in the flat buffer, in elements.
struct ParamRange {
  std::string name;  // "dense0/bias"
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// AdamW's decay mask over a flat buffer of NUMEL elements: 1 everywhere, except 0 over the
// ranges of biases and norm parameters (names ending in "/bias", "/gamma", "/beta") unless
// DECAY_BIASES: they only shift or scale the output, and decaying them toward 0 hurts (the
// usual no_decay group of PyTorch recipes). Allocates; setup only.
Tensor decay_mask(std::int64_t numel, const std::vector<ParamRange>& params, bool decay_biases);

// Learning-rate schedules, PyTorch-like, as a pure function of the applied optimizer steps.
struct ScheduleOptions {
  std::string name = "constant";  // constant | step | cosine | one-cycle
  std::int64_t warmup_steps = 0;  // linear warmup (not with one-cycle, which has its own)
  std::int64_t step_size = 0;     // step: decay every step_size steps after warmup (> 0)
  double gamma = 0.1;             // step: the factor per decay
  double min_lr = 0;              // cosine: the LR at the end (eta_min)
  double max_lr = 0;              // one-cycle: the peak (0: the base LR)
  double pct_start = 0.3;         // one-cycle: fraction of the steps spent rising
  double div_factor = 25;         // one-cycle: initial LR = max_lr / div_factor
  double final_div_factor = 1e4;  // one-cycle: final LR = initial LR / final_div_factor
};

// Throws UserError naming the --schedule.* option when OPTIONS do not fit TOTAL_STEPS.
void validate(const ScheduleOptions& options, double base_lr, std::int64_t total_steps);

// lr(s) is the learning rate of the update that follows s applied updates (s = 0 for the
// first), over a run of TOTAL_STEPS updates. With W = warmup_steps, for s < W:
//   lr(s) = after_warmup(0) * (s + 1) / W      (never 0: the first update moves the weights)
// and for s >= W, with t = s - W and T = total_steps - W (t is clamped to T):
//   constant:  base_lr
//   step:      base_lr * gamma^floor(t / step_size)                    (torch StepLR)
//   cosine:    min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2  (CosineAnnealingLR)
//   one-cycle: torch OneCycleLR, cosine annealing: from max_lr / div_factor up to max_lr at
//              step pct_start * T - 1, then down to max_lr / div_factor / final_div_factor
//              at step T - 1.
class Schedule {
 public:
  Schedule(ScheduleOptions options, double base_lr, std::int64_t total_steps);
  double lr(std::int64_t applied_steps) const;
  const ScheduleOptions& options() const { return options_; }

 private:
  double after_warmup(std::int64_t t) const;
  ScheduleOptions options_;
  double base_lr_;
  std::int64_t total_steps_;
};

// The table kernels::decide_step reads on the device (kernels/step_state.hpp), on DEVICE: row k
// is the update that follows A = APPLIED_AT_START + k applied updates, with lr =
// SCHEDULE.lr(A + SCHEDULE_OFFSET) (as a double; the optimizers round it to float, as step(float)
// does) and the bias corrections 1 - BETA1^t, 1 - BETA2^t for t = A + 1 (AdamW's, in double as
// AdamW::step computes them; SGD passes 0 and gets 1). ROWS >= 1: the updates this run can
// apply, one per step (the last row serves any later one). Allocates; setup only.
Tensor schedule_table(const Schedule& schedule, std::int64_t schedule_offset,
                      std::int64_t applied_at_start, std::int64_t rows, float beta1, float beta2,
                      Device device);

// Clipping by global norm (torch.nn.utils.clip_grad_norm_): computes the L2 norm of GRADS (f32,
// accumulated in double) and, when MAX_NORM > 0, scales GRADS in place by
// min(1, max_norm / (norm + 1e-6)). Returns the norm before clipping.
double clip_by_global_norm(Tensor& grads, double max_norm);

// The base LR after the linear scaling rule (Goyal et al. 2017): with SCALING "linear",
// lr * global_batch / reference_batch; with "none", lr. Throws UserError for other names.
double scaled_lr(double lr, const std::string& scaling, std::int64_t global_batch,
                 std::int64_t reference_batch);

}  // namespace mpt::optim
