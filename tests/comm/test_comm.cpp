// World collectives and the setup agreement, run under mpiexec -n 2 and -n 4.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "comm/comm.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace mpt::comm {
namespace {

TEST(World, RanksAndNodeView) {
  World world;
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world.size(), size);
  EXPECT_GE(world.local_rank(), 0);
  EXPECT_LT(world.local_rank(), world.local_size());
  EXPECT_LE(world.local_size(), world.size());
}

TEST(World, AllreduceSumAndBroadcast) {
  World world;
  Tensor t({5}, DType::f32);
  for (int i = 0; i < 5; ++i) t.data<float>()[i] = static_cast<float>(world.rank() + i);
  world.allreduce_sum(t);
  const int n = world.size();
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(t.data<float>()[i], n * (n - 1) / 2.0f + n * i);
  Tensor b({3}, DType::f32);
  if (world.rank() == 0) b.data<float>()[2] = 42.0f;
  world.broadcast(b, 0);
  EXPECT_EQ(b.data<float>()[2], 42.0f);
  EXPECT_EQ(world.max(static_cast<double>(world.rank())), n - 1);
}

// What the watchdog reads: every World collective counts once and is marked only while inside,
// and the count is the same on every rank (the census compares it across ranks).
TEST(Watchdog, CollectivesAreCountedAndMarked) {
  World world;
  Progress& p = progress();
  EXPECT_EQ(p.collective.load(), static_cast<int>(Collective::none));
  const auto before = p.entered.load();
  double values[2] = {1, 2};
  world.allreduce_max(values, 2);
  world.barrier();
  std::vector<double> gathered;
  world.gather(values, 2, gathered, 0);
  EXPECT_EQ(p.entered.load() - before, 3u);
  EXPECT_EQ(p.collective.load(), static_cast<int>(Collective::none));
  {
    const CollectiveScope scope(Collective::gradient_bucket, 7);
    EXPECT_EQ(p.collective.load(), static_cast<int>(Collective::gradient_bucket));
    EXPECT_EQ(p.index.load(), 7);
  }
  EXPECT_EQ(p.collective.load(), static_cast<int>(Collective::none));
  // The names the watchdog's line prints, the NCCL communicator's construction among them.
  EXPECT_STREQ(collective_name(Collective::gradient_bucket), "gradient bucket");
  EXPECT_STREQ(collective_name(Collective::communicator_setup), "communicator setup");
  set_phase(Phase::backward, 12);
  EXPECT_EQ(p.phase.load(), static_cast<int>(Phase::backward));
  EXPECT_EQ(p.step.load(), 12);
  set_phase(Phase::optimizer);  // keeps the step
  EXPECT_EQ(p.step.load(), 12);
  double entered = static_cast<double>(p.entered.load());
  double low = entered, high = entered;
  world.allreduce_max(&high, 1);
  low = -world.max(-low);
  EXPECT_EQ(low, high);
}

// A watchdog with a generous timeout never fires on a healthy job, and stops promptly.
TEST(Watchdog, QuietOnAHealthyJobAndStopsPromptly) {
  World world;
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  const auto start = std::chrono::steady_clock::now();
  {
    Watchdog watchdog(world.handle(), 0.5, level >= MPI_THREAD_MULTIPLE);
    EXPECT_TRUE(watchdog.active());
    for (int i = 0; i < 20; ++i) world.barrier();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  Watchdog off(world.handle(), 0, false);
  EXPECT_FALSE(off.active());
}

TEST(World, AgreedSuccessReturnsOnEveryRank) {
  World world;
  int calls = 0;
  world.run_agreed([&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(World, FailureOnOneRankStopsEveryRankWithItsExitCode) {
  World world;
  const int failing = world.size() - 1;  // the last rank fails, the others succeed
  testing::internal::CaptureStderr();
  int code = 0;
  try {
    world.run_agreed([&] {
      if (world.rank() == failing) throw_user_error("bad file 'x.h5'", "fix it");
    });
  } catch (const ReportedFailure& failure) {
    code = failure.exit_code();
  }
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, kExitUserError);
  // Only the failing rank prints, once, with its rank in the message.
  if (world.rank() == failing) {
    EXPECT_NE(printed.find("rank " + std::to_string(failing) + " on"), std::string::npos) << printed;
    EXPECT_NE(printed.find("bad file 'x.h5' (hint: fix it)"), std::string::npos) << printed;
  } else {
    EXPECT_EQ(printed, "");
  }
}

TEST(World, LowestFailingRankReports) {
  World world;
  testing::internal::CaptureStderr();
  bool threw = false;
  try {
    world.run_agreed([] { throw_user_error("same error everywhere", "hint"); });
  } catch (const ReportedFailure&) {
    threw = true;
  }
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(threw);
  EXPECT_EQ(printed.empty(), world.rank() != 0) << printed;
}

TEST(World, InternalErrorsAreAgreedToo) {
  World world;
  int code = 0;
  testing::internal::CaptureStderr();
  try {
    world.run_agreed([&] {
      if (world.rank() == 0) throw std::runtime_error("boom");
    });
  } catch (const ReportedFailure& failure) {
    code = failure.exit_code();
  }
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, kExitInternalError);
}

}  // namespace
}  // namespace mpt::comm
