// Mixed precision: the dynamic loss scaler (PyTorch GradScaler / Megatron semantics, with
// hysteresis) whose whole state is one struct, so the checkpoint can save and restore it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/step_state.hpp"

namespace mpt::amp {

struct LossScalerOptions {
  bool enabled = true;           // false: scale 1, never skip (fp32, and bf16 by default)
  double init_scale = 65536.0;   // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  // clean steps before the scale grows
  std::int64_t hysteresis = 1;   // overflows tolerated before the scale backs off
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
  double static_scale = 0.0;      // > 0: a fixed scale (--amp.loss-scale), overflow still skips
  bool fail_at_min_scale = false;  // an overflow at min-scale ends the run with an error
};

// Everything that changes while training; saved in checkpoints.
struct LossScalerState {
  double scale = 65536.0;
  std::int64_t growth_tracker = 0;      // clean steps since the last change
  std::int64_t hysteresis_tracker = 1;  // overflows left before backing off
  std::int64_t skipped_steps = 0;       // steps skipped for non-finite gradients, in total
};

// What update() decided for one step.
struct ScaleDecision {
  bool apply_step = true;  // false: gradients overflowed, skip the optimizer step
  double old_scale = 1.0;
  double new_scale = 1.0;
};

class LossScaler {
 public:
  // Throws UserError naming the --amp.* option when OPTIONS is inconsistent.
  explicit LossScaler(const LossScalerOptions& options);

  // The factor the loss is multiplied by before backward.
  double scale() const { return state_.scale; }
  // Records whether this step's (reduced) gradients were all finite, and moves the scale.
  // Throws UserError when fail_at_min_scale is set and an overflow happens at min-scale.
  ScaleDecision update(bool gradients_finite);

  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

// OPTIONS as the rule kernels::decide_step applies to the scale on the gradients' device (the
// trainer's path; LossScaler::update is the same rules on the host).
inline kernels::ScaleRule scale_rule(const LossScalerOptions& options) {
  kernels::ScaleRule rule;
  rule.dynamic = options.enabled && options.static_scale == 0;
  rule.growth_factor = options.growth_factor;
  rule.backoff_factor = options.backoff_factor;
  rule.min_scale = options.min_scale;
  rule.max_scale = options.max_scale;
  rule.growth_interval = options.growth_interval;
  rule.hysteresis = options.hysteresis;
  rule.fail_at_min_scale = options.fail_at_min_scale;
  return rule;
}

}  // namespace mpt::amp
