// StepReports: a step's state is copied when the step is recorded and handed back LAG steps
// later, oldest first; a drain hands back the rest; MPTRAIN_REPORT_LAG overrides the lag and
// rejects anything but 0 to 8.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.hpp"
#include "kernels/step_state.hpp"
#include "train/step_reports.hpp"

namespace mpt::train {
namespace {

void set_loss(Tensor& state, double loss) {
  kernels::StepState s = kernels::read_step_state(state);
  s.loss_sum = loss;
  kernels::write_step_state(state, s);
}

TEST(StepReports, HandsBackEachStepsCopyLagStepsLateInOrder) {
  Tensor state = kernels::step_state_tensor(kernels::StepState{}, Device::cpu);
  StepReports reports(state, 2);
  for (int step = 1; step <= 5; ++step) {
    set_loss(state, 10.0 * step);
    reports.record(step);
    const auto report = reports.next(/*drain=*/false);
    if (step <= 2) {
      EXPECT_FALSE(report.has_value()) << "step " << step;
      continue;
    }
    ASSERT_TRUE(report.has_value()) << "step " << step;
    // The state of step - 2 as it was recorded, not the state now.
    EXPECT_EQ(report->step, step - 2);
    EXPECT_EQ(report->state.loss_sum, 10.0 * (step - 2));
  }
  set_loss(state, -1);  // later writes do not reach the queued copies
  for (int step = 4; step <= 5; ++step) {
    const auto report = reports.next(/*drain=*/true);
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->step, step);
    EXPECT_EQ(report->state.loss_sum, 10.0 * step);
  }
  EXPECT_FALSE(reports.next(/*drain=*/true).has_value());
}

TEST(StepReports, LagZeroHandsBackAtOnce) {
  Tensor state = kernels::step_state_tensor(kernels::StepState{}, Device::cpu);
  StepReports reports(state, 0);
  set_loss(state, 3);
  reports.record(7);
  const auto report = reports.next(/*drain=*/false);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->step, 7);
  EXPECT_EQ(report->state.loss_sum, 3);
}

TEST(StepReports, LagFromTheEnvironment) {
  ::unsetenv("MPTRAIN_REPORT_LAG");
  EXPECT_EQ(report_lag(Device::cpu), 0);
  EXPECT_EQ(report_lag(Device::cuda), 1);
  ::setenv("MPTRAIN_REPORT_LAG", "3", 1);
  EXPECT_EQ(report_lag(Device::cpu), 3);
  for (const char* bad : {"9", "-1", "1x", "x"}) {
    ::setenv("MPTRAIN_REPORT_LAG", bad, 1);
    EXPECT_THROW(report_lag(Device::cpu), UserError) << bad;
  }
  ::unsetenv("MPTRAIN_REPORT_LAG");
}

}  // namespace
}  // namespace mpt::train
