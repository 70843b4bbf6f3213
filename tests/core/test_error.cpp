// core/error.hpp's FailureContext (what a fatal line adds about what the thread was doing) and
// device_memory's scratch generation (what kernels::StepGraph checks before a replay).
#include <gtest/gtest.h>

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

TEST(ScratchGeneration, CountsEachReplacement) {
  const std::uint64_t before = device_memory::scratch_generation();
  device_memory::note_scratch_replaced();
  device_memory::note_scratch_replaced();
  EXPECT_EQ(device_memory::scratch_generation(), before + 2);
}

}  // namespace
}  // namespace mpt
