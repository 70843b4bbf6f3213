// core/error.hpp's FailureContext (what a fatal line adds about what the thread was doing),
// its abort hook, and device_memory's scratch generation (what kernels::StepGraph checks
// before a replay).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <thread>

#include "core/device_memory.hpp"
#include "core/error.hpp"

namespace mpt {
namespace {

TEST(FailureContext, NamesTheInnermostAndRestoresTheOuter) {
  EXPECT_EQ(detail::failure_context_suffix(), "");
  {
    const FailureContext outer("capturing CUDA graph 'step'");
    EXPECT_EQ(detail::failure_context_suffix(), " (while capturing CUDA graph 'step')");
    {
      const FailureContext inner("planning conv1");
      EXPECT_EQ(detail::failure_context_suffix(), " (while planning conv1)");
    }
    EXPECT_EQ(detail::failure_context_suffix(), " (while capturing CUDA graph 'step')");
  }
  EXPECT_EQ(detail::failure_context_suffix(), "");
}

TEST(FailureContext, BelongsToItsThread) {
  const FailureContext mine("capturing CUDA graph 'step'");
  std::string other = "unset";
  std::thread([&] { other = detail::failure_context_suffix(); }).join();
  EXPECT_EQ(other, "") << "another thread's failures are not this capture's";
  EXPECT_EQ(detail::failure_context_suffix(), " (while capturing CUDA graph 'step')");
}

// The fatal lines themselves, printed by a child process that then ends with exit status 3 (the
// code MPI_Abort and _Exit are given). "threadsafe": the child re-runs this binary up to the
// test, so it has its own MPI singleton rather than a fork of this one.
TEST(FailureContextDeathTest, AbortJobLineEndsWithTheContext) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const FailureContext context("capturing CUDA graph 'step'");
        abort_job("replay after a scratch replacement");
      },
      ::testing::ExitedWithCode(3),
      "mptrain: fatal: \\[.*\\] replay after a scratch replacement \\(while capturing CUDA graph 'step'\\)");
}

TEST(FailureContextDeathTest, CheckFailedLineEndsWithTheInnermostContext) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const FailureContext outer("capturing CUDA graph 'step'");
        const FailureContext inner("planning conv1");
        const int bad_count = MPI_ERR_COUNT;
        MPT_CHECK_MPI(bad_count);
      },
      ::testing::ExitedWithCode(3),
      "MPI call `bad_count` failed: MPI_ERR_COUNT.* at .*test_error.cpp:[0-9]+ \\(while planning conv1\\)");
}

TEST(FailureContextDeathTest, NoContextNoSuffix) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(abort_job("plain invariant"), ::testing::ExitedWithCode(3),
              "\\] plain invariant\n");
}

// The abort hook (the nccl backend's communicator abort) runs before the fatal line's job ends,
// for abort_job and for a failed check alike, and once only, even if it fails itself.
void abort_hook_says_so() { std::fprintf(stderr, "abort hook ran\n"); }
void abort_hook_that_fails() {
  std::fprintf(stderr, "failing hook ran\n");
  abort_job("the hook's own failure");
}

TEST(AbortHookDeathTest, RunsBeforeAbortJobEnds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_abort_hook(&abort_hook_says_so);
        abort_job("an invariant");
      },
      ::testing::ExitedWithCode(3), "\\] an invariant\n(.|\n)*abort hook ran\n");
}

TEST(AbortHookDeathTest, RunsBeforeAFailedCheckEnds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_abort_hook(&abort_hook_says_so);
        const int bad_count = MPI_ERR_COUNT;
        MPT_CHECK_MPI(bad_count);
      },
      ::testing::ExitedWithCode(3), "MPI call `bad_count` failed(.|\n)*abort hook ran\n");
}

TEST(AbortHookDeathTest, AFailingHookRunsOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_abort_hook(&abort_hook_that_fails);
        abort_job("first");
      },
      ::testing::ExitedWithCode(3),
      // Run twice, the hook would recurse until the stack overflows: no exit code 3.
      "\\] first\nfailing hook ran\nmptrain: fatal: [^\n]*the hook's own failure\n");
}

TEST(ScratchGeneration, CountsEachReplacement) {
  const std::uint64_t before = device_memory::scratch_generation();
  device_memory::note_scratch_replaced();
  device_memory::note_scratch_replaced();
  EXPECT_EQ(device_memory::scratch_generation(), before + 2);
}

}  // namespace
}  // namespace mpt
