// The conv lowering kernels (im2col against a direct unfold, col2im as its exact adjoint, the
// per-channel bias), pooling on a plane with known answers and NaN, and GELU against float64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/conv2d.hpp"
#include "kernels/gelu.hpp"
#include "kernels/pool2d.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

TEST(Im2col, MatchesDirectUnfoldAndCol2imIsItsAdjoint) {
  // Odd shapes: C 3, 7x9, K 3, stride 2, pad 1 -> 4x5 positions.
  const Conv2dGeometry g{3, 7, 9, 3, 2, 1};
  ASSERT_EQ(g.out_height(), 4);
  ASSERT_EQ(g.out_width(), 5);
  const Tensor x = test::random_tensor({3, 7, 9}, 1);
  Tensor col({g.col_rows(), g.col_columns()}, DType::f32);
  im2col(x, g, col);
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 3; ++j)
        for (std::int64_t oh = 0; oh < 4; ++oh)
          for (std::int64_t ow = 0; ow < 5; ++ow) {
            const std::int64_t h = oh * 2 - 1 + i, w = ow * 2 - 1 + j;
            const float expected =
                h < 0 || h >= 7 || w < 0 || w >= 9 ? 0.f : x.data<float>()[(c * 7 + h) * 9 + w];
            ASSERT_EQ(col.data<float>()[((c * 3 + i) * 3 + j) * 20 + oh * 5 + ow], expected);
          }
  // <im2col(x), r> == <x, col2im(r)> in float64, to f32 rounding of the col2im sums.
  const Tensor r = test::random_tensor({g.col_rows(), g.col_columns()}, 2);
  Tensor folded({3, 7, 9}, DType::f32);
  folded.data<float>()[0] = 123.f;  // overwritten, not accumulated
  col2im(r, g, folded);
  double left = 0, right = 0;
  for (std::int64_t i = 0; i < col.numel(); ++i)
    left += double{col.data<float>()[i]} * r.data<float>()[i];
  for (std::int64_t i = 0; i < x.numel(); ++i)
    right += double{x.data<float>()[i]} * folded.data<float>()[i];
  EXPECT_NEAR(left, right, 1e-4);
}

TEST(ChannelBias, AddsPerRowAndSumsRows) {
  Tensor y({2, 3}, DType::f32), bias({2}, DType::f32), grad({2}, DType::f32);
  bias.data<float>()[0] = 1.f;
  bias.data<float>()[1] = -2.f;
  channel_bias_forward(y, bias);
  EXPECT_EQ(y.data<float>()[2], 1.f);
  EXPECT_EQ(y.data<float>()[3], -2.f);
  channel_bias_backward(y, grad, false);
  EXPECT_EQ(grad.data<float>()[0], 3.f);
  channel_bias_backward(y, grad, true);
  EXPECT_EQ(grad.data<float>()[1], -12.f);
}

TEST(Pool2d, KnownPlaneAndNaN) {
  // A 3x5 plane 0..14; 2x2 windows every 2 cover rows 0-1, columns 0-3 (ceil_mode off).
  const Pool2dGeometry g{3, 5, 2, 2, 2};
  Tensor x({1, 3, 5}, DType::f32), y({1, 1, 2}, DType::f32);
  for (int i = 0; i < 15; ++i) x.data<float>()[i] = static_cast<float>(i);
  max_pool2d_forward(x, g, y);
  EXPECT_EQ(y.data<float>()[0], 6.f);
  EXPECT_EQ(y.data<float>()[1], 8.f);
  avg_pool2d_forward(x, g, y);
  EXPECT_EQ(y.data<float>()[0], 3.f);  // (0+1+5+6)/4
  Tensor dy({1, 1, 2}, DType::f32), dx({1, 3, 5}, DType::f32);
  dy.data<float>()[0] = 1.f;
  dy.data<float>()[1] = 2.f;
  max_pool2d_backward(x, g, dy, dx);
  EXPECT_EQ(dx.data<float>()[6], 1.f);
  EXPECT_EQ(dx.data<float>()[8], 2.f);
  EXPECT_EQ(dx.data<float>()[0], 0.f);
  avg_pool2d_backward(g, dy, dx);
  EXPECT_EQ(dx.data<float>()[0], 0.25f);
  EXPECT_EQ(dx.data<float>()[4], 0.f);  // column 4 lies in no window
  // A NaN wins its window, so loss scaling sees the overflow.
  x.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  max_pool2d_forward(x, g, y);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(y.data<float>()[1], 8.f);
}

TEST(Gelu, ErfFormAgainstFloat64) {
  const Tensor x = test::random_tensor({1000}, 3, -6.f, 6.f);
  Tensor y({1000}, DType::f32), dx({1000}, DType::f32);
  const Tensor dy = test::random_tensor({1000}, 4);
  gelu_forward(x, y);
  gelu_backward(x, dy, dx);
  for (std::int64_t i = 0; i < 1000; ++i) {
    const double v = x.data<float>()[i];
    const double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    // A few f32 ulp of values up to 6.
    ASSERT_NEAR(y.data<float>()[i], v * cdf, 2e-6 * std::max(1.0, std::fabs(v))) << v;
    ASSERT_NEAR(dx.data<float>()[i], dy.data<float>()[i] * (cdf + v * pdf), 2e-6) << v;
  }
}

}  // namespace
}  // namespace mpt::kernels
