// unscale_and_check: scales every bucket by 1/S in one call, reports any Inf or NaN in any
// bucket, and widens f16/bf16 inputs into f32 outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

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

}  // namespace
}  // namespace mpt
