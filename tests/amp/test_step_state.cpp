// The step's decisions as kernels over a StepState (kernels/step_state.hpp), against the host
// objects they replace in the trainer: decide_step against amp::LossScaler::update over random
// overflow sequences and every option; the schedule table against optim::Schedule and AdamW's
// bias corrections; the optimizers' controlled step against step(lr); clip_grad_norm against
// optim::clip_by_global_norm; the loss kernel and the poison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "amp/amp.hpp"
#include "core/error.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/step_state.hpp"
#include "optim/optim.hpp"

namespace mpt {
namespace {

Tensor one_row_schedule() {
  Tensor table({1, kernels::kScheduleColumns}, DType::f64);
  table.data<double>()[0] = 0.1;
  table.data<double>()[1] = table.data<double>()[2] = 1;
  return table;
}

struct ScalerCase {
  const char* name;
  amp::LossScalerOptions options;
};

std::vector<ScalerCase> scaler_cases() {
  std::vector<ScalerCase> cases;
  amp::LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  cases.push_back({"growth interval 3", o});
  o.hysteresis = 3;
  cases.push_back({"hysteresis 3", o});
  o.min_scale = 64;
  o.max_scale = 4096;
  o.growth_factor = 4;
  o.backoff_factor = 0.25;
  cases.push_back({"bounds and factors", o});
  o.fail_at_min_scale = true;
  cases.push_back({"fail at min scale", o});
  amp::LossScalerOptions fixed;
  fixed.static_scale = 512;
  cases.push_back({"static scale", fixed});
  amp::LossScalerOptions off;
  off.enabled = false;
  cases.push_back({"disabled", off});
  return cases;
}

TEST(DecideStep, FollowsLossScalerOverRandomOverflows) {
  const Tensor schedule = one_row_schedule();
  for (const auto& c : scaler_cases()) {
    SCOPED_TRACE(c.name);
    for (const double p_overflow : {0.1, 0.5, 0.9}) {
      amp::LossScaler scaler(c.options);
      kernels::StepState init;
      init.scale = scaler.state().scale;
      init.hysteresis_tracker = static_cast<double>(scaler.state().hysteresis_tracker);
      Tensor state = kernels::step_state_tensor(init, Device::cpu);
      std::mt19937 rng(7);
      std::bernoulli_distribution overflow(p_overflow);
      std::int64_t applied = 0;
      for (int step = 0; step < 400; ++step) {
        const bool finite = !overflow(rng);
        kernels::begin_step(state);
        kernels::StepState s = kernels::read_step_state(state);
        s.found_inf = finite ? 0 : 1;
        kernels::write_step_state(state, s);
        bool threw = false;
        amp::ScaleDecision decision;
        try {
          decision = scaler.update(finite);
        } catch (const UserError&) {
          threw = true;
        }
        kernels::decide_step(state, amp::scale_rule(c.options), schedule);
        s = kernels::read_step_state(state);
        ASSERT_EQ(s.failed_at_min_scale != 0, threw) << "step " << step;
        if (threw) break;  // the trainer stops there
        applied += finite ? 1 : 0;
        ASSERT_EQ(s.skip == 0, decision.apply_step) << "step " << step;
        ASSERT_EQ(s.old_scale, decision.old_scale) << "step " << step;
        ASSERT_EQ(s.scale, scaler.state().scale) << "step " << step;
        ASSERT_EQ(s.growth_tracker, static_cast<double>(scaler.state().growth_tracker));
        ASSERT_EQ(s.hysteresis_tracker, static_cast<double>(scaler.state().hysteresis_tracker));
        ASSERT_EQ(s.skipped_steps, static_cast<double>(scaler.state().skipped_steps));
        ASSERT_EQ(s.applied_steps, static_cast<double>(applied));
      }
    }
  }
}

TEST(DecideStep, ReadsTheScheduleRowOfTheAppliedStepsAndClamps) {
  optim::ScheduleOptions options;
  options.name = "cosine";
  options.warmup_steps = 3;
  const optim::Schedule schedule(options, 0.1, 20);
  // Resumed at 5 applied updates, a schedule offset of 2, four rows: the fifth update on reads
  // the last row.
  const Tensor table = optim::schedule_table(schedule, 2, 5, 4, 0.9f, 0.999f, Device::cpu);
  kernels::StepState init;
  init.applied_steps = init.applied_at_start = 5;
  Tensor state = kernels::step_state_tensor(init, Device::cpu);
  kernels::ScaleRule fixed;
  fixed.dynamic = false;
  const bool found[] = {false, true, false, false, false, false, false};
  std::int64_t applied = 5;
  for (const bool overflow : found) {
    kernels::begin_step(state);
    kernels::StepState s = kernels::read_step_state(state);
    s.found_inf = overflow ? 1 : 0;
    kernels::write_step_state(state, s);
    kernels::decide_step(state, fixed, table);
    s = kernels::read_step_state(state);
    const std::int64_t row = std::min<std::int64_t>(applied - 5, 3);
    EXPECT_EQ(s.lr, schedule.lr(5 + row + 2)) << "applied " << applied;
    const double t = static_cast<double>(5 + row + 1);
    EXPECT_EQ(s.bias_correction1, 1.0 - std::pow(static_cast<double>(0.9f), t));
    EXPECT_EQ(s.bias_correction2, 1.0 - std::pow(static_cast<double>(0.999f), t));
    applied += overflow ? 0 : 1;
    EXPECT_EQ(s.applied_steps, static_cast<double>(applied));
  }
}

Tensor random_tensor(std::int64_t n, std::uint32_t seed, float scale = 1.f) {
  Tensor t({n}, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, scale);
  for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = normal(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.raw(), b.raw(), a.size_bytes()) == 0;
}

// Runs KIND ("sgd" or "adamw") for 5 updates through step(lr) and through the controlled step,
// with overflow at update 2 (skipped by both), and compares the parameters bit for bit.
void compare_controlled(const std::string& kind) {
  constexpr std::int64_t n = 1000;
  const Tensor params0 = random_tensor(n, 1);
  Tensor p_host = params0.to(Device::cpu), p_dev = params0.to(Device::cpu);
  Tensor g_host({n}, DType::f32), g_dev({n}, DType::f32);
  std::unique_ptr<optim::Optimizer> a, b;
  optim::ScheduleOptions schedule_options;
  schedule_options.name = "step";
  schedule_options.step_size = 2;
  schedule_options.gamma = 0.5;
  const optim::Schedule schedule(schedule_options, 0.05, 10);
  if (kind == "sgd") {
    optim::SgdOptions o;
    o.lr = 0.05f;
    o.nesterov = true;
    o.weight_decay = 1e-3f;
    a = std::make_unique<optim::Sgd>(p_host, g_host, o);
    b = std::make_unique<optim::Sgd>(p_dev, g_dev, o);
  } else {
    optim::AdamwOptions o;
    o.lr = 0.05f;
    o.weight_decay = 0.01f;
    a = std::make_unique<optim::AdamW>(p_host, g_host, o);
    b = std::make_unique<optim::AdamW>(p_dev, g_dev, o);
  }
  const bool adamw = kind == "adamw";
  const Tensor table = optim::schedule_table(schedule, 0, 0, 10, adamw ? 0.9f : 0.f,
                                             adamw ? 0.999f : 0.f, Device::cpu);
  Tensor state = kernels::step_state_tensor(kernels::StepState{}, Device::cpu);
  kernels::ScaleRule fixed;
  fixed.dynamic = false;
  for (int update = 0; update < 5; ++update) {
    const Tensor g = random_tensor(n, 100 + update, 0.1f);
    std::memcpy(g_host.raw(), g.raw(), g.size_bytes());
    std::memcpy(g_dev.raw(), g.raw(), g.size_bytes());
    const bool overflow = update == 2;
    if (!overflow) a->step(static_cast<float>(schedule.lr(a->steps())));
    kernels::begin_step(state);
    kernels::StepState s = kernels::read_step_state(state);
    s.found_inf = overflow ? 1 : 0;
    kernels::write_step_state(state, s);
    kernels::decide_step(state, fixed, table);
    const Tensor before = p_dev.to(Device::cpu);
    b->step(state);
    if (overflow) {
      EXPECT_TRUE(same_bits(before, p_dev)) << kind << ": a skipped update wrote";
    }
    b->set_steps(static_cast<std::int64_t>(kernels::read_step_state(state).applied_steps));
    EXPECT_TRUE(same_bits(p_host, p_dev)) << kind << " differs after update " << update;
    EXPECT_EQ(a->steps(), b->steps());
  }
}

TEST(ControlledStep, SgdMatchesStepWithTheHostLr) { compare_controlled("sgd"); }
TEST(ControlledStep, AdamwMatchesStepWithTheHostLr) { compare_controlled("adamw"); }

TEST(ClipGradNorm, MatchesClipByGlobalNormAndSkips) {
  for (const double max_norm : {0.0, 0.5, 1e6}) {
    Tensor a = random_tensor(5000, 3), b = a.to(Device::cpu);
    const double want = optim::clip_by_global_norm(a, max_norm);
    Tensor state = kernels::step_state_tensor(kernels::StepState{}, Device::cpu);
    kernels::begin_step(state);
    kernels::clip_grad_norm(b, state, max_norm);
    EXPECT_EQ(std::sqrt(kernels::read_step_state(state).grad_sumsq), want);
    EXPECT_TRUE(same_bits(a, b)) << "max_norm " << max_norm;
  }
  Tensor c = random_tensor(100, 4), before = c.to(Device::cpu);
  kernels::StepState skipped;
  skipped.skip = 1;
  Tensor state = kernels::step_state_tensor(skipped, Device::cpu);
  kernels::clip_grad_norm(c, state, 1e-3);
  EXPECT_TRUE(same_bits(c, before));
  EXPECT_EQ(kernels::read_step_state(state).grad_sumsq, -1);
}

TEST(SoftmaxXentStep, ScalesByTheStateAndSumsOverMicroBatches) {
  Tensor logits = random_tensor(12 * 5, 9, 3.f).reshaped({12, 5});
  Tensor labels({12}, DType::i32);
  for (int i = 0; i < 12; ++i) labels.data<std::int32_t>()[i] = i % 5;
  Tensor want({12, 5}, DType::f32), got({12, 5}, DType::f32);
  kernels::StepState init;
  init.scale = 1024;
  Tensor state = kernels::step_state_tensor(init, Device::cpu);
  kernels::begin_step(state);
  const auto stats = kernels::softmax_xent_forward_backward(logits, labels, want, 0.125f * 1024.f);
  kernels::softmax_xent_step(logits, labels, got, 0.125f, state);
  kernels::softmax_xent_step(logits, labels, got, 0.125f, state);
  EXPECT_TRUE(same_bits(want, got));
  const kernels::StepState s = kernels::read_step_state(state);
  EXPECT_EQ(s.loss_sum, stats.loss_sum + stats.loss_sum);
  EXPECT_EQ(s.correct, 2.0 * static_cast<double>(stats.correct));
  kernels::begin_step(state);
  EXPECT_EQ(kernels::read_step_state(state).loss_sum, 0);
}

TEST(PoisonIfNonfiniteLoss, WritesANanOnlyForANonfiniteLoss) {
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Tensor grads({4}, dtype);
    grads.zero();
    kernels::StepState s;
    s.loss_sum = 3.5;
    Tensor state = kernels::step_state_tensor(s, Device::cpu);
    kernels::poison_if_nonfinite_loss(grads, state);
    Tensor zeros({4}, dtype);
    zeros.zero();
    EXPECT_TRUE(same_bits(grads, zeros));
    s.loss_sum = std::nan("");
    kernels::write_step_state(state, s);
    kernels::poison_if_nonfinite_loss(grads, state);
    Tensor wide({4}, DType::f32);
    Tensor in[1] = {grads};
    Tensor out[1] = {wide};
    s.found_inf = 0;
    s.scale = 1;
    kernels::write_step_state(state, s);
    kernels::unscale_and_check_step(in, out, state);
    EXPECT_EQ(kernels::read_step_state(state).found_inf, 1) << dtype_name(dtype);
    EXPECT_TRUE(std::isnan(wide.data<float>()[0]));
    EXPECT_EQ(wide.data<float>()[1], 0.f);
  }
}

}  // namespace
}  // namespace mpt
