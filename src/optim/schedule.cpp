// Learning-rate schedules (constant, step, cosine, one-cycle with linear warmup) and the linear
// scaling rule: pure functions of the applied optimizer steps, so that a resume replays them.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.hpp"
#include "kernels/step_state.hpp"
#include "optim/optim.hpp"

namespace mpt::optim {

void validate(const ScheduleOptions& options, double base_lr, std::int64_t total_steps) {
  const std::string& name = options.name;
  MPT_REQUIRE(name == "constant" || name == "step" || name == "cosine" || name == "one-cycle",
              "unknown schedule '" + name + "' (--schedule.name)",
              "use constant, step, cosine or one-cycle");
  MPT_REQUIRE(
      options.warmup_steps >= 0,
      "--schedule.warmup-steps is " + std::to_string(options.warmup_steps) + ", but must be >= 0",
      "0 turns warmup off");
  MPT_REQUIRE(options.warmup_steps <= total_steps,
              "--schedule.warmup-steps=" + std::to_string(options.warmup_steps) +
                  " is longer than the run (" + std::to_string(total_steps) + " steps)",
              "lower --schedule.warmup-steps or train for more steps");
  if (name == "step") {
    MPT_REQUIRE(options.step_size > 0, "--schedule.step-size must be > 0 for --schedule.name=step",
                "e.g. --schedule.step-size=1000 (in optimizer steps)");
    MPT_REQUIRE(std::isfinite(options.gamma) && options.gamma > 0 && options.gamma <= 1,
                "--schedule.gamma must be in (0, 1]", "e.g. --schedule.gamma=0.1");
  }
  if (name == "cosine")
    MPT_REQUIRE(std::isfinite(options.min_lr) && options.min_lr >= 0 && options.min_lr <= base_lr,
                "--schedule.min-lr is " + std::to_string(options.min_lr) +
                    ", but must be in [0, the base LR " + std::to_string(base_lr) + "]",
                "e.g. --schedule.min-lr=0");
  if (name == "one-cycle") {
    MPT_REQUIRE(
        options.warmup_steps == 0,
        "--schedule.warmup-steps must be 0 with --schedule.name=one-cycle",
        "one-cycle rises from max-lr/25 by itself; set its length with --schedule.pct-start");
    MPT_REQUIRE(std::isfinite(options.max_lr) && options.max_lr >= 0,
                "--schedule.max-lr must be >= 0",
                "0 uses the base LR (--optimizer.lr) as the peak");
    MPT_REQUIRE(options.pct_start > 0 && options.pct_start < 1,
                "--schedule.pct-start must be in (0, 1)", "the usual value is 0.3");
    MPT_REQUIRE(options.pct_start * static_cast<double>(total_steps) >= 2,
                "--schedule.name=one-cycle needs pct-start * steps >= 2, but the run has " +
                    std::to_string(total_steps) + " steps",
                "train for more steps or raise --schedule.pct-start");
  }
}

Schedule::Schedule(ScheduleOptions options, double base_lr, std::int64_t total_steps)
    : options_(std::move(options)), base_lr_(base_lr), total_steps_(total_steps) {
  validate(options_, base_lr_, total_steps_);
}

double Schedule::lr(std::int64_t applied_steps) const {
  const std::int64_t warmup = options_.warmup_steps;
  if (applied_steps < warmup)
    return after_warmup(0) * static_cast<double>(applied_steps + 1) / static_cast<double>(warmup);
  return after_warmup(applied_steps - warmup);
}

double Schedule::after_warmup(std::int64_t t) const {
  const std::int64_t span = std::max<std::int64_t>(1, total_steps_ - options_.warmup_steps);
  t = std::clamp<std::int64_t>(t, 0, span);
  const auto& o = options_;
  if (o.name == "step") return base_lr_ * std::pow(o.gamma, static_cast<double>(t / o.step_size));
  if (o.name == "cosine")
    return o.min_lr + (base_lr_ - o.min_lr) *
                          (1 + std::cos(std::numbers::pi * static_cast<double>(t) /
                                        static_cast<double>(span))) /
                          2;
  if (o.name == "one-cycle") {
    // torch.optim.lr_scheduler.OneCycleLR (anneal_strategy "cos", three_phase off).
    const double max_lr = o.max_lr > 0 ? o.max_lr : base_lr_;
    const double initial = max_lr / o.div_factor;
    const double final_lr = initial / o.final_div_factor;
    const double up_end = o.pct_start * static_cast<double>(span) - 1;
    const double down_end = static_cast<double>(span) - 1;
    const auto anneal = [](double start, double end, double pct) {
      return end + (start - end) / 2 * (1 + std::cos(std::numbers::pi * pct));
    };
    const double s = std::min(static_cast<double>(t), down_end);
    if (s <= up_end) return anneal(initial, max_lr, s / up_end);
    return anneal(max_lr, final_lr, (s - up_end) / (down_end - up_end));
  }
  return base_lr_;
}

double scaled_lr(double lr, const std::string& scaling, std::int64_t global_batch,
                 std::int64_t reference_batch) {
  MPT_REQUIRE(scaling == "none" || scaling == "linear",
              "unknown --optimizer.lr-scaling '" + scaling + "'", "use none or linear");
  if (scaling == "none") return lr;
  MPT_REQUIRE(reference_batch > 0,
              "--optimizer.reference-batch must be > 0, got " + std::to_string(reference_batch),
              "the batch the base LR was tuned for, e.g. 256");
  return lr * static_cast<double>(global_batch) / static_cast<double>(reference_batch);
}

Tensor schedule_table(const Schedule& schedule, std::int64_t schedule_offset,
                      std::int64_t applied_at_start, std::int64_t rows, float beta1, float beta2,
                      Device device) {
  if (rows < 1) abort_job("optim::schedule_table: needs at least one row");
  Tensor table({rows, kernels::kScheduleColumns}, DType::f64);
  double* out = table.data<double>();
  for (std::int64_t k = 0; k < rows; ++k) {
    const std::int64_t applied = applied_at_start + k;
    const double t = static_cast<double>(applied + 1);
    out[k * kernels::kScheduleColumns + kernels::kScheduleLr] = schedule.lr(applied + schedule_offset);
    out[k * kernels::kScheduleColumns + kernels::kScheduleBias1] =
        1.0 - std::pow(static_cast<double>(beta1), t);
    out[k * kernels::kScheduleColumns + kernels::kScheduleBias2] =
        1.0 - std::pow(static_cast<double>(beta2), t);
  }
  return device == Device::cpu ? table : table.to(device);
}

}  // namespace mpt::optim
