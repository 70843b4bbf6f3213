// optim::AdamW (options, bias correction, decay mask, steps), the learning-rate schedules at
// their key steps, the linear scaling rule, and clipping by global norm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "optim/optim.hpp"

namespace mpt::optim {
namespace {

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const UserError& error) {
    EXPECT_FALSE(error.hint().empty()) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}

TEST(AdamwOptimizer, RejectsBadOptionsNamingThem) {
  const std::pair<AdamwOptions, const char*> cases[] = {
      {{-1e-3f, 0.9f, 0.999f, 1e-8f, 0.f}, "--optimizer.lr"},
      {{1e-3f, 1.f, 0.999f, 1e-8f, 0.f}, "--optimizer.beta1"},
      {{1e-3f, 0.9f, -0.1f, 1e-8f, 0.f}, "--optimizer.beta2"},
      {{1e-3f, 0.9f, 0.999f, 0.f, 0.f}, "--optimizer.eps"},
      {{1e-3f, 0.9f, 0.999f, 1e-8f, -0.1f}, "--optimizer.weight-decay"},
  };
  for (const auto& [options, option] : cases)
    EXPECT_NE(error_of([&] { validate(options); }).find(option), std::string::npos) << option;
  EXPECT_NO_THROW(validate(AdamwOptions{}));
}

// Constant g = 0.5: with bias correction every step moves p by lr (see tests/kernels/
// test_adamw_norm.cpp); without it the first step would move by lr * 0.05 / sqrt(2.5e-4) = 3.2 lr.
// p0 = 1, lr 0.1, wd 0.01; element 1 is a "bias" (mask 0).
TEST(AdamwOptimizer, ThreeHandComputedStepsWithBiasCorrectionAndMask) {
  Tensor params({2}, DType::f32), grads({2}, DType::f32), mask({2}, DType::u8);
  params.data<float>()[0] = params.data<float>()[1] = 1.f;
  grads.data<float>()[0] = grads.data<float>()[1] = 0.5f;
  mask.data<std::uint8_t>()[0] = 1;
  AdamW adamw(params, grads, AdamwOptions{0.1f, 0.9f, 0.999f, 1e-8f, 0.01f}, mask);
  const double decayed[3] = {0.899, 0.798101, 0.697302899};
  const double masked[3] = {0.9, 0.8, 0.7};
  for (int t = 0; t < 3; ++t) {
    adamw.step(0.1f);
    EXPECT_NEAR(params.data<float>()[0], decayed[t], 2e-6) << t;
    EXPECT_NEAR(params.data<float>()[1], masked[t], 2e-6) << t;
  }
  EXPECT_EQ(adamw.steps(), 3);
  const auto state = adamw.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].name, "exp_avg");
  EXPECT_NEAR(state[0].value.data<float>()[0], 0.5 * (1 - std::pow(0.9, 3)), 1e-6);
  EXPECT_EQ(state[1].name, "exp_avg_sq");
}

// Through the Optimizer interface, Sgd still steps as before and reports its buffer.
TEST(AdamwOptimizer, SgdBehindTheInterface) {
  Tensor params({1}, DType::f32), grads({1}, DType::f32);
  params.data<float>()[0] = 1.f;
  grads.data<float>()[0] = 0.5f;
  std::unique_ptr<Optimizer> sgd =
      std::make_unique<Sgd>(params, grads, SgdOptions{0.1f, 0.9f, 0.1f, false});
  sgd->step(0.1f);
  EXPECT_NEAR(params.data<float>()[0], 0.94, 1e-7);
  EXPECT_EQ(sgd->steps(), 1);
  ASSERT_EQ(sgd->state().size(), 1u);
  EXPECT_EQ(sgd->state()[0].name, "momentum_buffer");
}

TEST(AdamwOptimizer, DecayMaskLeavesBiasesOut) {
  const std::vector<ParamRange> params = {{"dense0/weight", 0, 6},
                                          {"dense0/bias", 6, 2},
                                          {"dense1/weight", 8, 2},
                                          {"dense1/bias", 10, 1}};
  const Tensor mask = decay_mask(11, params, false);
  const std::uint8_t expected[11] = {1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0};
  EXPECT_EQ(std::memcmp(mask.raw(), expected, 11), 0);
  const Tensor all = decay_mask(11, params, true);
  for (std::int64_t i = 0; i < 11; ++i) EXPECT_EQ(all.data<std::uint8_t>()[i], 1) << i;
}

TEST(AdamwOptimizer, DecayMaskLeavesNormParametersOut) {
  // A resblock's BatchNorm scale and shift are not decayed; its conv weight is; a parameter
  // merely containing "gamma" in its layer name is not mistaken for one.
  const std::vector<ParamRange> params = {{"block0/conv1/weight", 0, 3},
                                          {"block0/bn1/gamma", 3, 2},
                                          {"block0/bn1/beta", 5, 2},
                                          {"gamma_dense/weight", 7, 1}};
  const Tensor mask = decay_mask(8, params, false);
  const std::uint8_t expected[8] = {1, 1, 1, 0, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(mask.raw(), expected, 8), 0);
}

TEST(Schedule, ConstantWithWarmup) {
  ScheduleOptions o;
  o.warmup_steps = 10;
  const Schedule s(o, 0.1, 100);
  EXPECT_NEAR(s.lr(0), 0.01, 1e-15);  // the first update already moves: (0 + 1) / 10
  EXPECT_NEAR(s.lr(4), 0.05, 1e-15);
  EXPECT_NEAR(s.lr(9), 0.1, 1e-15);  // end of warmup
  EXPECT_EQ(s.lr(10), 0.1);
  EXPECT_EQ(s.lr(99), 0.1);
}

TEST(Schedule, StepDecay) {
  ScheduleOptions o;
  o.name = "step";
  o.step_size = 30;
  o.gamma = 0.1;
  const Schedule s(o, 0.1, 100);
  EXPECT_EQ(s.lr(0), 0.1);
  EXPECT_EQ(s.lr(29), 0.1);
  EXPECT_NEAR(s.lr(30), 0.01, 1e-15);
  EXPECT_NEAR(s.lr(60), 0.001, 1e-15);
  EXPECT_NEAR(s.lr(99), 1e-4, 1e-15);
  o.warmup_steps = 10;  // the decay counts from the end of warmup
  const Schedule w(o, 0.1, 100);
  EXPECT_NEAR(w.lr(9), 0.1, 1e-15);
  EXPECT_NEAR(w.lr(39), 0.1, 1e-15);
  EXPECT_NEAR(w.lr(40), 0.01, 1e-15);
}

TEST(Schedule, CosineWithWarmup) {
  ScheduleOptions o;
  o.name = "cosine";
  o.warmup_steps = 10;
  o.min_lr = 0.001;
  const Schedule s(o, 0.1, 110);  // 100 cosine steps after warmup
  EXPECT_NEAR(s.lr(0), 0.01, 1e-15);
  EXPECT_NEAR(s.lr(9), 0.1, 1e-15);
  EXPECT_NEAR(s.lr(10), 0.1, 1e-15);
  EXPECT_NEAR(s.lr(60), 0.001 + 0.099 / 2, 1e-15);  // mid: cos(pi/2) = 0
  EXPECT_NEAR(s.lr(109), 0.001 + 0.099 * (1 + std::cos(std::numbers::pi * 0.99)) / 2, 1e-15);
  EXPECT_NEAR(s.lr(110), 0.001, 1e-15);  // end, and it stays there
  EXPECT_NEAR(s.lr(500), 0.001, 1e-15);
}

// torch.optim.lr_scheduler.OneCycleLR(max_lr=1, total_steps=100, pct_start=0.3): the rise ends
// at step 29, the fall at step 99.
TEST(Schedule, OneCycleLikeTorch) {
  ScheduleOptions o;
  o.name = "one-cycle";
  o.max_lr = 1.0;
  const Schedule s(o, 0.1, 100);
  EXPECT_NEAR(s.lr(0), 1.0 / 25, 1e-15);
  EXPECT_NEAR(s.lr(29), 1.0, 1e-15);
  EXPECT_NEAR(s.lr(64), (1.0 + 0.04 / 1e4) / 2, 1e-12);  // halfway down
  EXPECT_NEAR(s.lr(99), 0.04 / 1e4, 1e-15);
  o.max_lr = 0;  // the base LR is the peak
  EXPECT_NEAR(Schedule(o, 0.1, 100).lr(29), 0.1, 1e-15);
}

TEST(Schedule, RejectsBadOptionsNamingThem) {
  ScheduleOptions bad_name;
  bad_name.name = "linear-ish";
  EXPECT_NE(error_of([&] { Schedule(bad_name, 0.1, 10); }).find("--schedule.name"),
            std::string::npos);
  ScheduleOptions step;
  step.name = "step";
  EXPECT_NE(error_of([&] { Schedule(step, 0.1, 10); }).find("--schedule.step-size"),
            std::string::npos);
  ScheduleOptions warmup;
  warmup.warmup_steps = 11;
  EXPECT_NE(error_of([&] { Schedule(warmup, 0.1, 10); }).find("--schedule.warmup-steps"),
            std::string::npos);
  ScheduleOptions cosine;
  cosine.name = "cosine";
  cosine.min_lr = 0.5;
  EXPECT_NE(error_of([&] { Schedule(cosine, 0.1, 10); }).find("--schedule.min-lr"),
            std::string::npos);
  ScheduleOptions cycle;
  cycle.name = "one-cycle";
  cycle.warmup_steps = 2;
  EXPECT_NE(error_of([&] { Schedule(cycle, 0.1, 10); }).find("--schedule.warmup-steps"),
            std::string::npos);
}

TEST(LrScaling, LinearRule) {
  EXPECT_EQ(scaled_lr(0.1, "none", 512, 256), 0.1);
  EXPECT_NEAR(scaled_lr(0.1, "linear", 512, 256), 0.2, 1e-15);
  EXPECT_NEAR(scaled_lr(0.1, "linear", 64, 256), 0.025, 1e-15);
  EXPECT_NE(error_of([] { scaled_lr(0.1, "sqrt", 64, 256); }).find("--optimizer.lr-scaling"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_lr(0.1, "linear", 64, 0); }).find("--optimizer.reference-batch"),
            std::string::npos);
}

TEST(ClipByGlobalNorm, ScalesAboveTheThresholdOnly) {
  Tensor g({2}, DType::f32);
  g.data<float>()[0] = 3.f;
  g.data<float>()[1] = 4.f;
  EXPECT_DOUBLE_EQ(clip_by_global_norm(g, 10.0), 5.0);  // below: untouched
  EXPECT_EQ(g.data<float>()[0], 3.f);
  EXPECT_EQ(g.data<float>()[1], 4.f);
  EXPECT_DOUBLE_EQ(clip_by_global_norm(g, 0.0), 5.0);  // off: only measured
  EXPECT_EQ(g.data<float>()[0], 3.f);
  EXPECT_DOUBLE_EQ(clip_by_global_norm(g, 1.0), 5.0);  // returns the pre-clip norm
  EXPECT_NEAR(g.data<float>()[0], 0.6, 1e-6);
  EXPECT_NEAR(g.data<float>()[1], 0.8, 1e-6);
  EXPECT_NEAR(std::hypot(g.data<float>()[0], g.data<float>()[1]), 1.0, 1e-6);
}

TEST(ClipByGlobalNorm, NormOfALargeBufferMatchesFloat64) {
  const std::int64_t n = 1 << 20;
  Tensor g({n}, DType::f32);
  double reference = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float value = 1e-3f * static_cast<float>((i * 7919) % 2001 - 1000);
    g.data<float>()[i] = value;
    reference += double(value) * value;
  }
  const double norm = clip_by_global_norm(g, 2.0);
  EXPECT_NEAR(norm, std::sqrt(reference), 1e-12 * std::sqrt(reference));
  double after = 0;
  for (std::int64_t i = 0; i < n; ++i) after += double(g.data<float>()[i]) * g.data<float>()[i];
  EXPECT_NEAR(std::sqrt(after), 2.0, 1e-5);
}

}  // namespace
}  // namespace mpt::optim
