// Mixed precision: the dynamic loss scaler (PyTorch GradScaler / Megatron semantics, with
// hysteresis) whose whole state is one struct, so the checkpoint can save and restore it.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace mpt::amp
