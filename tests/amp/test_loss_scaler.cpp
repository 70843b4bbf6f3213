// LossScaler: growth after growth-interval clean steps, backoff on overflow, hysteresis, the
// min/max bounds, static mode, fail-at-min-scale, and the skipped-step count.
#include <gtest/gtest.h>

#include "amp/amp.hpp"
#include "core/error.hpp"

namespace mpt::amp {
namespace {

LossScalerOptions small_interval() {
  LossScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  return options;
}

TEST(LossScaler, DefaultsMatchTheDesign) {
  LossScaler scaler{LossScalerOptions{}};
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_EQ(scaler.options().max_scale, 16777216.0);
}

TEST(LossScaler, GrowsAfterGrowthIntervalCleanSteps) {
  LossScaler scaler(small_interval());
  EXPECT_EQ(scaler.update(true).new_scale, 1024);
  EXPECT_EQ(scaler.update(true).new_scale, 1024);
  const auto third = scaler.update(true);
  EXPECT_TRUE(third.apply_step);
  EXPECT_EQ(third.old_scale, 1024);
  EXPECT_EQ(third.new_scale, 2048);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
}

TEST(LossScaler, OverflowSkipsHalvesAndResetsGrowth) {
  LossScaler scaler(small_interval());
  scaler.update(true);
  scaler.update(true);
  const auto overflow = scaler.update(false);
  EXPECT_FALSE(overflow.apply_step);
  EXPECT_EQ(overflow.new_scale, 512);
  EXPECT_EQ(scaler.state().skipped_steps, 1);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
  // The interval restarts: two clean steps are not enough to grow.
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1024);
}

TEST(LossScaler, HysteresisToleratesOverflowsBeforeBackingOff) {
  auto options = small_interval();
  options.hysteresis = 2;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.update(false).new_scale, 1024);  // first overflow: tolerated, still skipped
  EXPECT_EQ(scaler.state().skipped_steps, 1);
  EXPECT_EQ(scaler.update(false).new_scale, 512);   // second: backs off
  EXPECT_EQ(scaler.update(false).new_scale, 256);   // tracker exhausted until growth refills it
  for (int i = 0; i < 3; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.state().hysteresis_tracker, 2);
  EXPECT_EQ(scaler.update(false).new_scale, 512);  // tolerated again
}

TEST(LossScaler, RespectsMinAndMax) {
  auto options = small_interval();
  options.init_scale = 4;
  options.min_scale = 2;
  options.max_scale = 8;
  LossScaler scaler(options);
  scaler.update(false);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 2);
  for (int i = 0; i < 30; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8);
}

TEST(LossScaler, StaticModeNeverMovesButStillSkips) {
  auto options = small_interval();
  options.static_scale = 128;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 128);
  for (int i = 0; i < 10; ++i) scaler.update(true);
  const auto overflow = scaler.update(false);
  EXPECT_FALSE(overflow.apply_step);
  EXPECT_EQ(scaler.scale(), 128);
  EXPECT_EQ(scaler.state().skipped_steps, 1);
}

TEST(LossScaler, DisabledIsScaleOneAndNeverMoves) {
  LossScalerOptions options;
  options.enabled = false;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 1);
  for (int i = 0; i < 5000; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1);
}

TEST(LossScaler, FailAtMinScaleIsAUserError) {
  auto options = small_interval();
  options.init_scale = 2;
  options.min_scale = 1;
  options.fail_at_min_scale = true;
  LossScaler scaler(options);
  scaler.update(false);  // 2 -> 1
  try {
    scaler.update(false);
    FAIL() << "expected a UserError at min-scale";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("--amp.fail-at-min-scale"), std::string::npos);
  }
}

TEST(LossScaler, StateRoundTrips) {
  LossScaler a(small_interval());
  a.update(true);
  a.update(false);
  LossScaler b(small_interval());
  b.set_state(a.state());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.update(i % 3 != 0).new_scale, b.update(i % 3 != 0).new_scale);
  EXPECT_EQ(a.state().skipped_steps, b.state().skipped_steps);
}

TEST(LossScaler, BadOptionsNameTheOption) {
  auto options = small_interval();
  options.backoff_factor = 1.5;
  try {
    LossScaler scaler(options);
    FAIL();
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("--amp.backoff-factor"), std::string::npos);
  }
}

}  // namespace
}  // namespace mpt::amp
