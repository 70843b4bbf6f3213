// Dynamic loss scaling (see amp.hpp). Growth and backoff follow PyTorch's GradScaler; the
// hysteresis counter follows Megatron-LM, so a single spike need not halve the scale.
#include <algorithm>
#include <cmath>

#include "amp/amp.hpp"
#include "core/error.hpp"

namespace mpt::amp {

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  const auto& o = options_;
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  MPT_REQUIRE(o.static_scale >= 0 && std::isfinite(o.static_scale), "--amp.loss-scale must be >= 0",
              "0 selects dynamic scaling; a positive value is a fixed scale, e.g. 1024");
  MPT_REQUIRE(positive(o.init_scale), "--amp.init-scale must be positive", "the usual value is 65536");
  MPT_REQUIRE(positive(o.growth_factor) && o.growth_factor >= 1, "--amp.growth-factor must be >= 1",
              "the usual value is 2");
  MPT_REQUIRE(positive(o.backoff_factor) && o.backoff_factor < 1, "--amp.backoff-factor must be in (0, 1)",
              "the usual value is 0.5");
  MPT_REQUIRE(o.growth_interval > 0, "--amp.growth-interval must be positive", "the usual value is 2000");
  MPT_REQUIRE(o.hysteresis > 0, "--amp.hysteresis must be positive", "1 backs off at every overflow");
  MPT_REQUIRE(positive(o.min_scale) && positive(o.max_scale) && o.min_scale <= o.max_scale,
              "--amp.min-scale and --amp.max-scale must be positive with min <= max",
              "the usual values are 1 and 16777216 (2^24)");
  state_.scale = !o.enabled ? 1.0
                 : o.static_scale > 0 ? o.static_scale
                                      : std::clamp(o.init_scale, o.min_scale, o.max_scale);
  state_.hysteresis_tracker = o.hysteresis;
}

ScaleDecision LossScaler::update(bool gradients_finite) {
  ScaleDecision decision{gradients_finite, state_.scale, state_.scale};
  if (!gradients_finite) ++state_.skipped_steps;
  if (!options_.enabled || options_.static_scale > 0) return decision;

  if (gradients_finite) {
    if (++state_.growth_tracker >= options_.growth_interval) {
      state_.growth_tracker = 0;
      state_.hysteresis_tracker = options_.hysteresis;
      state_.scale = std::min(state_.scale * options_.growth_factor, options_.max_scale);
    }
  } else {
    MPT_REQUIRE(!(options_.fail_at_min_scale && state_.scale <= options_.min_scale),
                "gradients overflow even at the minimum loss scale " + std::to_string(state_.scale) +
                    " (--amp.fail-at-min-scale)",
                "the model diverged: lower --optimizer.lr, or train in bf16/fp32");
    state_.growth_tracker = 0;
    // As in Megatron-LM, the tracker is refilled only by growth: once HYSTERESIS overflows
    // were tolerated, every further overflow backs off until the scale grows again.
    if (--state_.hysteresis_tracker <= 0) {
      state_.hysteresis_tracker = 0;
      state_.scale = std::max(state_.scale * options_.backoff_factor, options_.min_scale);
    }
  }
  decision.new_scale = state_.scale;
  return decision;
}

}  // namespace mpt::amp
