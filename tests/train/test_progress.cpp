// The progress bar's line: fields, widths and the ETA's format.
#include <gtest/gtest.h>

#include <cstdio>

#include "train/progress.hpp"

namespace mpt::train {
namespace {

ProgressView halfway() {
  ProgressView view;
  view.step = 1875;
  view.total_steps = 3750;
  view.epoch = 3;
  view.epochs = 8;
  view.loss = 0.4312;
  view.samples_per_s = 12345.4;
  view.eta_s = 134;
  return view;
}

TEST(Progress, LineCarriesEveryFieldAndFitsTheWidth) {
  const std::string line = render_progress(halfway(), 120);
  EXPECT_EQ(line,
            "epoch 4/8 [###############...............] step 1875/3750  50%  ETA 2m14s  loss "
            "0.4312  12345 samples/s");
  // Narrower: the bar shrinks first, to what the counters leave.
  const std::string fitted = render_progress(halfway(), 100);
  EXPECT_LE(fitted.size(), 100u);
  EXPECT_NE(fitted.find("[#############..............]"), std::string::npos) << fitted;
}

TEST(Progress, NarrowTerminalsDropTheBarThenClip) {
  const std::string narrow = render_progress(halfway(), 80);
  EXPECT_EQ(narrow.find('['), std::string::npos) << narrow;
  EXPECT_NE(narrow.find("step 1875/3750"), std::string::npos) << narrow;
  EXPECT_EQ(render_progress(halfway(), 20).size(), 20u);
  EXPECT_EQ(render_progress(halfway(), 0), "");
}

TEST(Progress, UnknownLossAndEtaAndHours) {
  ProgressView view = halfway();
  view.loss = -1;
  view.eta_s = -1;
  std::string line = render_progress(view, 200);
  EXPECT_NE(line.find("ETA --  loss -  "), std::string::npos) << line;
  view.eta_s = 3 * 3600 + 25 * 60 + 9;
  view.step = view.total_steps;
  line = render_progress(view, 200);
  EXPECT_NE(line.find("ETA 3h25m"), std::string::npos) << line;
  EXPECT_NE(line.find("[##############################]"), std::string::npos) << line;
  EXPECT_NE(line.find("100%"), std::string::npos) << line;
}

TEST(Progress, DisabledBarWritesNothing) {
  std::FILE* sink = std::tmpfile();
  ASSERT_NE(sink, nullptr);
  ProgressBar off(sink, ProgressBar::Mode::off, 10, 1);
  for (int step = 1; step <= 10; ++step) off.update(step, 0, step * 64);
  off.clear();
  EXPECT_EQ(std::ftell(sink), 0L);
  // A file is no terminal: Mode::terminal stays silent, Mode::always draws.
  ProgressBar quiet(sink, ProgressBar::Mode::terminal, 10, 1);
  for (int step = 1; step <= 10; ++step) quiet.update(step, 0, step * 64);
  EXPECT_EQ(std::ftell(sink), 0L);
  ProgressBar on(sink, ProgressBar::Mode::always, 10, 1);
  for (int step = 1; step <= 10; ++step) on.update(step, 0, step * 64);  // the last step draws
  EXPECT_GT(std::ftell(sink), 0L);
  std::fclose(sink);
}

}  // namespace
}  // namespace mpt::train
