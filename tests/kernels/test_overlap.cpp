// kernels::detail::overlap, which the launchers' require_disjoint refuses an output by: views
// of one buffer that meet overlap, views that only touch do not; and the launchers still take
// outputs that sit right after an input in one planned buffer, a cast onto itself, and
// element-wise ops in place. The refusals themselves, on the host and the device, are
// tests/gpu/overlap_cases.cpp.
#include <gtest/gtest.h>

#include <memory>

#include "kernels/add.hpp"
#include "kernels/cast.hpp"
#include "kernels/check.hpp"
#include "kernels/matmul.hpp"
#include "kernels/relu.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

using detail::overlap;

TEST(Overlap, ViewsOverlapWhenTheyShareAnElement) {
  const Tensor buffer({64}, DType::f32);
  const Tensor first = Tensor::view(buffer, 0, {16}), next = Tensor::view(buffer, 16, {16});
  const Tensor straddle = Tensor::view(buffer, 15, {2}), last = Tensor::view(buffer, 63, {1});
  EXPECT_FALSE(overlap(first, next));  // they touch at one address: no byte in common
  EXPECT_FALSE(overlap(next, first));
  EXPECT_TRUE(overlap(first, straddle));
  EXPECT_TRUE(overlap(straddle, next));
  EXPECT_TRUE(overlap(first, first));
  EXPECT_TRUE(overlap(buffer, last));
  EXPECT_TRUE(overlap(last, buffer));
  EXPECT_FALSE(overlap(first, last));
  EXPECT_TRUE(overlap(buffer, buffer.reshaped({8, 8})));
}

TEST(Overlap, EmptyUndefinedAndSeparateTensorsDoNot) {
  const Tensor buffer({64}, DType::f32), other({64}, DType::f32);
  EXPECT_FALSE(overlap(buffer, other));
  EXPECT_FALSE(overlap(buffer, Tensor()));
  EXPECT_FALSE(overlap(Tensor(), Tensor()));
  EXPECT_FALSE(overlap(buffer, Tensor::view(buffer, 8, {0})));  // no bytes, nothing shared
}

TEST(Overlap, CountsBytesAcrossElementWidths) {
  // An f16 tensor over the first 64 bytes of an f32 buffer: element 16 of the f32 view is
  // byte 64, the first byte past it.
  const Tensor buffer({32}, DType::f32);
  const Tensor half = Tensor::adopt(const_cast<void*>(buffer.raw()), {32}, DType::f16,
                                    std::make_shared<Tensor>(buffer));
  EXPECT_TRUE(overlap(half, Tensor::view(buffer, 15, {1})));
  EXPECT_FALSE(overlap(half, Tensor::view(buffer, 16, {16})));
}

TEST(Overlap, LaunchersTakeOutputsThatOnlyTouchTheirInputs) {
  // A planned buffer of [a | c]: c starts where a ends.
  Tensor buffer = test::random_tensor({32}, 5);
  const Tensor a = Tensor::view(buffer, 0, {4, 4}), b = test::random_tensor({4, 4}, 6);
  Tensor c = Tensor::view(buffer, 16, {4, 4}), apart({4, 4}, DType::f32);
  matmul(a, false, b, false, c);
  matmul(a, false, b, false, apart);
  for (std::int64_t i = 0; i < 16; ++i) EXPECT_EQ(c.data<float>()[i], apart.data<float>()[i]);
  // A cast onto itself, in its own dtype, is a no-op (kernels/cast.hpp), not an overlap.
  Tensor same = apart;
  cast(apart, same);
  for (std::int64_t i = 0; i < 16; ++i) EXPECT_EQ(same.data<float>()[i], c.data<float>()[i]);
}

TEST(Overlap, ElementWiseOpsStillRunInPlace) {
  // require_same_or_disjoint lets the output be the input itself: a residual add into its
  // own input, a ReLU over its own buffer.
  Tensor a = test::random_tensor({64}, 7);
  const Tensor b = test::random_tensor({64}, 8), a_before = test::random_tensor({64}, 7);
  add(a, b, a);
  for (std::int64_t i = 0; i < 64; ++i)
    EXPECT_EQ(a.data<float>()[i], a_before.data<float>()[i] + b.data<float>()[i]);
  relu_forward(a, a);
  for (std::int64_t i = 0; i < 64; ++i) EXPECT_GE(a.data<float>()[i], 0.f);
}

}  // namespace
}  // namespace mpt::kernels
