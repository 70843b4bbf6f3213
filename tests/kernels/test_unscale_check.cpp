// unscale_and_check: scales every bucket by 1/S in one call, reports any Inf or NaN in any
// bucket, and widens f16/bf16 inputs into f32 outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/unscale_check.hpp"

namespace mpt {
namespace {

TEST(UnscaleAndCheck, ScalesEveryBucketAndReportsFinite) {
  std::vector<Tensor> buckets{Tensor({5}, DType::f32), Tensor({40000}, DType::f32), Tensor({0}, DType::f32)};
  for (auto& b : buckets)
    for (std::int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = static_cast<float>(i % 97) * 1024.f;
  EXPECT_TRUE(kernels::unscale_and_check(buckets, buckets, 1.f / 1024.f));
  for (auto& b : buckets)
    for (std::int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.data<float>()[i], static_cast<float>(i % 97));
}

TEST(UnscaleAndCheck, DetectsInfOrNanInAnyBucketAnywhere) {
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    for (std::int64_t position : {0L, 16383L, 16384L, 39999L}) {
      std::vector<Tensor> buckets{Tensor({5}, DType::f32), Tensor({40000}, DType::f32)};
      buckets[1].data<float>()[position] = bad;
      EXPECT_FALSE(kernels::unscale_and_check(buckets, buckets, 0.5f)) << bad << " at " << position;
    }
  }
  // Large but finite values are not overflows.
  std::vector<Tensor> big{Tensor({3}, DType::f32)};
  big[0].data<float>()[1] = std::numeric_limits<float>::max();
  EXPECT_TRUE(kernels::unscale_and_check(big, big, 1.f));
}

TEST(UnscaleAndCheck, WidensHalfAndBFloat16) {
  std::vector<Tensor> inputs{Tensor({3}, DType::f16), Tensor({2}, DType::bf16)};
  std::vector<Tensor> outputs{Tensor({3}, DType::f32), Tensor({2}, DType::f32)};
  inputs[0].data<Half>()[0] = to_half(2048.f);
  inputs[0].data<Half>()[2] = to_half(-4.f);
  inputs[1].data<BFloat16>()[1] = to_bf16(512.f);
  EXPECT_TRUE(kernels::unscale_and_check(inputs, outputs, 0.25f));
  EXPECT_EQ(outputs[0].data<float>()[0], 512.f);
  EXPECT_EQ(outputs[0].data<float>()[2], -1.f);
  EXPECT_EQ(outputs[1].data<float>()[1], 128.f);
  inputs[0].data<Half>()[1] = Half{0x7c00};  // +Inf in fp16
  EXPECT_FALSE(kernels::unscale_and_check(inputs, outputs, 0.25f));
}

// A bad bucket ends the job before any bucket is written (as on the device, where the flag is not
// even cleared): the abort hook, which runs after the fatal line and before the job ends,
// counts the elements of the first output that no longer hold their -1. "threadsafe": the
// child re-runs this binary up to the test, with its own MPI singleton.
const float* g_first_output = nullptr;
std::int64_t g_first_output_n = 0;

TEST(UnscaleAndCheckDeathTest, ABadBucketEndsTheJobBeforeAnyIsWritten) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<Tensor> inputs{Tensor({1000}, DType::f32), Tensor({8}, DType::f32)};
  std::vector<Tensor> outputs{Tensor({1000}, DType::f32), Tensor({7}, DType::f32)};
  for (std::int64_t i = 0; i < 1000; ++i) {
    inputs[0].data<float>()[i] = 1024.f;
    outputs[0].data<float>()[i] = -1.f;
  }
  g_first_output = outputs[0].data<float>();
  g_first_output_n = outputs[0].numel();
  EXPECT_EXIT(
      {
        set_abort_hook([] {
          std::int64_t written = 0;
          for (std::int64_t i = 0; i < g_first_output_n; ++i) written += g_first_output[i] != -1.f;
          std::fprintf(stderr, "first output: %lld written\n", static_cast<long long>(written));
        });
        kernels::unscale_and_check(inputs, outputs, 1.f / 1024.f);
      },
      testing::ExitedWithCode(3),
      "kernels::unscale_and_check: each output must hold as many elements as its input(.|\n)*"
      "first output: 0 written");
}

}  // namespace
}  // namespace mpt
