// The conv lowering kernels (im2col against a direct unfold, col2im as its exact adjoint, the
// per-channel bias), pooling on a plane with known answers and NaN, and GELU against float64.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/gelu.hpp"
#include "kernels/matmul.hpp"
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
  Tensor r = test::random_tensor({g.col_rows(), g.col_columns()}, 2);
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

TEST(Im2col, BlockOfSamplesIsTheirColumnsSideBySide) {
  // Three samples at once against one at a time, with padding wider than some taps reach
  // (C 2, 5x6, K 3, stride 1, pad 2), with "same" padding (the shifted-plane path) and with
  // stride 2: column block b is sample b's matrix, and col2im of the block is each sample's.
  for (const Conv2dGeometry& g :
       {Conv2dGeometry{2, 5, 6, 3, 1, 2}, Conv2dGeometry{2, 5, 6, 3, 1, 1},
        Conv2dGeometry{2, 5, 6, 3, 2, 1}}) {
    const std::int64_t samples = 3, sample = 2 * 5 * 6, rows = g.col_rows(), p = g.col_columns();
    const Tensor x = test::random_tensor({samples, 2, 5, 6}, 5);
    Tensor block({rows, samples * p}, DType::f32), one({rows, p}, DType::f32);
    im2col(x, g, block);
    // The direct unfold, and the adjoint identity <im2col(x), r> == <x, col2im(r)> over the block.
    const std::int64_t ow_n = g.out_width();
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t b = 0; b < samples; ++b)
        for (std::int64_t e = 0; e < p; ++e) {
          const std::int64_t c = row / 9, i = row / 3 % 3, j = row % 3;
          const std::int64_t h = e / ow_n * g.stride - g.pad + i,
                             w = e % ow_n * g.stride - g.pad + j;
          const float expected = h < 0 || h >= 5 || w < 0 || w >= 6
                                     ? 0.f
                                     : x.data<float>()[((b * 2 + c) * 5 + h) * 6 + w];
          ASSERT_EQ(block.data<float>()[row * samples * p + b * p + e], expected)
              << "sample " << b << " row " << row << " position " << e;
        }
    Tensor r = test::random_tensor({rows, samples * p}, 6);
    double left = 0, right = 0;
    for (std::int64_t i = 0; i < block.numel(); ++i)
      left += double{block.data<float>()[i]} * r.data<float>()[i];
    Tensor folded({samples, 2, 5, 6}, DType::f32), folded_one({2, 5, 6}, DType::f32);
    col2im(r, g, folded);
    for (std::int64_t i = 0; i < x.numel(); ++i)
      right += double{x.data<float>()[i]} * folded.data<float>()[i];
    EXPECT_NEAR(left, right, 1e-4);
    Tensor r_one({rows, p}, DType::f32);
    for (std::int64_t b = 0; b < samples; ++b) {
      im2col(Tensor::view(x, b * sample, {2, 5, 6}), g, one);
      for (std::int64_t row = 0; row < rows; ++row)
        for (std::int64_t e = 0; e < p; ++e) {
          ASSERT_EQ(block.data<float>()[row * samples * p + b * p + e],
                    one.data<float>()[row * p + e])
              << "sample " << b << " row " << row << " position " << e;
          r_one.data<float>()[row * p + e] = r.data<float>()[row * samples * p + b * p + e];
        }
      col2im(r_one, g, folded_one);
      for (std::int64_t e = 0; e < sample; ++e)
        ASSERT_FLOAT_EQ(folded.data<float>()[b * sample + e], folded_one.data<float>()[e])
            << "sample " << b << " element " << e;
    }
  }
}

TEST(Im2col, SixteenBitIsTheSameCopyAsF32) {
  // A copy in any width: im2col of the 16-bit samples holds exactly the 16-bit rounding of the
  // f32 im2col of the same (widened) values, padding +0, NaN and Inf copied, over the masked
  // "same" path, a strided one and a 1x1 one.
  for (const Conv2dGeometry& g :
       {Conv2dGeometry{2, 5, 6, 3, 1, 1}, Conv2dGeometry{3, 7, 9, 3, 2, 1},
        Conv2dGeometry{2, 6, 6, 5, 1, 2}, Conv2dGeometry{1, 4, 5, 1, 2, 1}}) {
    for (const DType dtype : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " K=" << g.kernel
                                        << " S=" << g.stride << " P=" << g.pad);
      const std::int64_t samples = 3, rows = g.col_rows(), columns = samples * g.col_columns();
      Tensor x = test::random_tensor({samples, g.channels, g.height, g.width}, 11);
      x.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
      x.data<float>()[2] = -std::numeric_limits<float>::infinity();
      Tensor x16(x.shape(), dtype);
      cast(x, x16);
      cast(x16, x);  // the values the 16-bit copy holds
      Tensor col({rows, columns}, DType::f32), expected({rows, columns}, dtype),
          col16({rows, columns}, dtype);
      im2col(x, g, col);
      cast(col, expected);
      im2col(x16, g, col16);
      const auto* want = static_cast<const std::uint16_t*>(expected.raw());
      const auto* got = static_cast<const std::uint16_t*>(col16.raw());
      for (std::int64_t i = 0; i < col16.numel(); ++i)
        ASSERT_EQ(got[i], want[i]) << "element " << i;
    }
  }
}

TEST(Im2colDeathTest, ColMustHaveTheInputsDtype) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Conv2dGeometry g{2, 5, 6, 3, 1, 1};
  const Tensor x16({1, 2, 5, 6}, DType::bf16);
  Tensor col({g.col_rows(), g.col_columns()}, DType::f32);
  EXPECT_EXIT(im2col(x16, g, col), testing::ExitedWithCode(3),
              "kernels::im2col: col must be \\[C\\*K\\*K, samples\\*OH\\*OW\\] in x's dtype");
}

// Whole convolutions through oneDNN are checked against direct convolutions in
// tests/nn/test_conv_layers.cpp (both host paths); here, what plan() declines and why, and the
// refusals of a call it cannot serve.
TEST(DnnlConv2d, PlansF32AndNativeBf16AndDeclinesTheRest) {
  const Conv2dGeometry g{2, 6, 6, 3, 1, 1};
  host::DnnlConv2d conv;
  EXPECT_EQ(conv.plan(g, 4, 3, DType::f32, true), dnnl_available()) << conv.describe();
  EXPECT_EQ(conv.planned(), dnnl_available());
  EXPECT_EQ(conv.plan(g, 4, 3, DType::bf16, false), host_matmul_takes(DType::bf16))
      << conv.describe();
  EXPECT_FALSE(conv.plan(g, 4, 3, DType::f16, false));
  EXPECT_FALSE(conv.planned());
  EXPECT_EQ(conv.scratch_bytes(), 0);
  if (dnnl_available()) {
    EXPECT_NE(conv.describe().find("float16 has no oneDNN convolution"), std::string::npos)
        << conv.describe();
  }
}

// A one-channel bf16 layer's weight gradient avoids oneDNN's AMX kernel, which runs it at 60 %
// of the AVX512-BF16 kernel's rate (docs/perf.md); three channels keep AMX where it is first.
TEST(DnnlConv2d, OneChannelBf16TakesTheAvx512Bf16WeightGradient) {
  if (!host_matmul_takes(DType::bf16)) GTEST_SKIP() << "no native bf16 oneDNN kernels on this CPU";
  host::DnnlConv2d one, three;
  ASSERT_TRUE(one.plan(Conv2dGeometry{1, 28, 28, 5, 1, 2}, 32, 128, DType::bf16, true))
      << one.describe();
  ASSERT_TRUE(three.plan(Conv2dGeometry{3, 28, 28, 5, 1, 2}, 32, 128, DType::bf16, true))
      << three.describe();
  const auto weights_kernel = [](const host::DnnlConv2d& conv) {
    const std::string text = conv.describe();
    return text.substr(text.find("bwd_weights="));
  };
  EXPECT_EQ(weights_kernel(one).find("amx"), std::string::npos) << one.describe();
  if (weights_kernel(three).find("amx") != std::string::npos) {  // an AMX core
    EXPECT_NE(weights_kernel(one).find("avx512_core_bf16"), std::string::npos) << one.describe();
  }
}

void forward_unplanned() {
  host::DnnlConv2d conv;
  conv.plan(Conv2dGeometry{2, 6, 6, 3, 1, 1}, 4, 3, DType::f16, false);  // declined
  const Tensor x({3, 2, 6, 6}, DType::f16), w({4, 2, 3, 3}, DType::f16), b({4}, DType::f32);
  Tensor y({3, 4, 6, 6}, DType::f16);
  conv.forward(x, w, b, y);
}

void forward_wrong_input() {
  host::DnnlConv2d conv;
  conv.plan(Conv2dGeometry{2, 6, 6, 3, 1, 1}, 4, 3, DType::f32, false);
  const Tensor x({5, 2, 6, 6}, DType::f32), w({4, 2, 3, 3}, DType::f32), b({4}, DType::f32);
  Tensor y({5, 4, 6, 6}, DType::f32);
  conv.forward(x, w, b, y);  // 5 samples against a plan for 3
}

TEST(DnnlConv2dDeathTest, RefusesACallItWasNotPlannedFor) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(forward_unplanned(), testing::ExitedWithCode(3),
              "kernels::DnnlConv2d::forward: plan\\(\\) it first");
  if (!dnnl_available()) return;
  EXPECT_EXIT(forward_wrong_input(), testing::ExitedWithCode(3),
              "x must be \\[n <= max_batch, C, H, W\\] of the plan");
}

TEST(ChannelRows, SamplesToRowsAndBackWithBias) {
  // [B 2, C 3, P 4] NCHW <-> [C 3, B*P 8] channel-major.
  const Tensor samples = test::random_tensor({2, 3, 4}, 7);
  Tensor rows({3, 8}, DType::f32), back({2, 3, 4}, DType::f32), bias({3}, DType::f32);
  samples_to_channel_rows(samples, rows);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t e = 0; e < 4; ++e)
        ASSERT_EQ(rows.data<float>()[c * 8 + b * 4 + e],
                  samples.data<float>()[(b * 3 + c) * 4 + e]);
  for (int c = 0; c < 3; ++c) bias.data<float>()[c] = static_cast<float>(c + 1);
  channel_rows_to_samples(rows, bias, back);
  for (std::int64_t i = 0; i < 24; ++i)
    ASSERT_EQ(back.data<float>()[i], samples.data<float>()[i] + static_cast<float>(i / 4 % 3 + 1));
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
  for (int i = 0; i < 15; ++i) dx.data<float>()[i] = 7.f;  // overwritten everywhere
  max_pool2d_backward(x, g, dy, dx);
  EXPECT_EQ(dx.data<float>()[6], 1.f);
  EXPECT_EQ(dx.data<float>()[8], 2.f);
  for (int i : {0, 1, 5, 7})
    EXPECT_EQ(dx.data<float>()[i], 0.f) << i;  // in a window, not its maximum
  for (int i : {4, 9, 10, 11, 12, 13, 14})
    EXPECT_EQ(dx.data<float>()[i], 0.f) << i;  // column 4 and row 2 lie in no window
  avg_pool2d_backward(g, dy, dx);
  EXPECT_EQ(dx.data<float>()[0], 0.25f);
  EXPECT_EQ(dx.data<float>()[4], 0.f);  // column 4 lies in no window
  // A NaN wins its window, so loss scaling sees the overflow.
  x.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  max_pool2d_forward(x, g, y);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(y.data<float>()[1], 8.f);
}

// Max pooling's backward against a plain loop over windows: the first maximum in scan order
// takes the gradient (values rounded to a few levels, so windows hold ties), a NaN wins unless
// one came before, and what no window covers gets 0. Disjoint 2x2 (the vectorised maxpool:2
// path, planes wider than one stretch of outputs), disjoint 3x3, and overlapping 3x3 stride 2.
TEST(Pool2d, MaxBackwardMatchesReferenceWithTiesAndNaN) {
  for (const Pool2dGeometry g : {Pool2dGeometry{9, 600, 2, 2, 2}, Pool2dGeometry{8, 11, 3, 3, 3},
                                 Pool2dGeometry{9, 11, 3, 3, 2}}) {
    const std::int64_t planes = 3, plane = g.height * g.width;
    const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
    Tensor x = test::random_tensor({planes, g.height, g.width}, 11, 0.f, 4.f);
    for (std::int64_t e = 0; e < x.numel(); ++e)
      x.data<float>()[e] = std::floor(x.data<float>()[e]);
    x.data<float>()[5] = x.data<float>()[g.width + 4] = std::numeric_limits<float>::quiet_NaN();
    const Tensor dy = test::random_tensor({planes, oh_n, ow_n}, 12);
    Tensor dx({planes, g.height, g.width}, DType::f32);
    for (std::int64_t e = 0; e < dx.numel(); ++e) dx.data<float>()[e] = 7.f;  // overwritten
    max_pool2d_backward(x, g, dy, dx);
    std::vector<float> expected(static_cast<std::size_t>(x.numel()), 0.f);
    for (std::int64_t p = 0; p < planes; ++p)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          std::int64_t best = -1;
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) {
              const std::int64_t at = p * plane + (oh * g.stride + i) * g.width + ow * g.stride + j;
              const float v = x.data<float>()[at];
              if (best < 0 || (!std::isnan(x.data<float>()[best]) &&
                               (std::isnan(v) || v > x.data<float>()[best])))
                best = at;
            }
          expected[static_cast<std::size_t>(best)] += dy.data<float>()[(p * oh_n + oh) * ow_n + ow];
        }
    for (std::int64_t e = 0; e < dx.numel(); ++e)
      ASSERT_EQ(dx.data<float>()[e], expected[static_cast<std::size_t>(e)])
          << "element " << e << ", window " << g.kernel_h << " stride " << g.stride;
  }
}

// An element's bits, f32 or 16-bit.
std::uint32_t bits_at(const Tensor& t, std::int64_t e) {
  if (t.dtype() == DType::f32) return std::bit_cast<std::uint32_t>(t.data<float>()[e]);
  return static_cast<const std::uint16_t*>(t.raw())[e];
}
void set_bits(Tensor& t, std::int64_t e, std::uint32_t bits) {
  if (t.dtype() == DType::f32)
    t.data<float>()[e] = std::bit_cast<float>(bits);
  else
    static_cast<std::uint16_t*>(t.raw())[e] = static_cast<std::uint16_t>(bits);
}

// Max pooling in every storage dtype against a plain loop over windows on the values: the
// forward's result is the bits of the last NaN of a window, else of its first maximum (-0 and
// +0 tie); the backward routes dy's bits to the first NaN, else the first maximum, and writes
// +0 elsewhere, including what no window covers. Values on a few levels (ties), both zeros,
// both infinities and NaNs of both signs with their own payloads. maxpool:2 through each of its
// clones this CPU runs (odd, square and wide planes: the masked row tails), disjoint 3x3 and
// 3x2 windows, and the forward of overlapping ones; f32's overlapping backward (it adds) is
// MaxBackwardMatchesReferenceWithTiesAndNaN's.
TEST(Pool2d, MaxPoolingSelectsTheSameBitsInEveryDtype) {
  struct Case {
    Pool2dGeometry g;
    bool backward;
  };
  const Case cases[] = {{{7, 11, 2, 2, 2}, true},  {{28, 28, 2, 2, 2}, true},
                        {{14, 14, 2, 2, 2}, true}, {{4, 600, 2, 2, 2}, true},
                        {{8, 11, 3, 3, 3}, true},  {{9, 10, 3, 2, 3}, false},
                        {{9, 11, 3, 3, 2}, false}};
  // Every clone this CPU runs (the others are checked on the CPUs that have them), the widest
  // last, so that it stays chosen.
  const host::PoolIsa widest = host::pool_isa();
  for (int isa = 0; isa <= static_cast<int>(widest); ++isa)
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (const auto& [g, backward] : cases) {
        host::limit_pool_isa(static_cast<host::PoolIsa>(isa));
        // (The 3x2 case's stride differs from its kernel width: forward only.)
        const std::int64_t planes = 3, plane = g.height * g.width;
        const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
        Tensor x32 = test::random_tensor({planes, g.height, g.width}, 21, -2.f, 2.f);
        for (std::int64_t e = 0; e < x32.numel(); ++e)
          x32.data<float>()[e] = std::round(x32.data<float>()[e]);  // -2..2, -0 among them
        // The specials are made in the 16-bit dtype (bf16 for f32, which widens them exactly,
        // payloads included).
        const DType half = dtype == DType::f16 ? DType::f16 : DType::bf16;
        Tensor x16({planes, g.height, g.width}, half);
        cast(x32, x16);
        const std::uint16_t inf = half == DType::f16 ? 0x7c00 : 0x7f80;
        const std::uint16_t specials[] = {0x8000,
                                          0x0000,
                                          inf,
                                          static_cast<std::uint16_t>(inf | 0x8000),
                                          static_cast<std::uint16_t>(inf | 1),
                                          static_cast<std::uint16_t>(inf | 0x8002),
                                          static_cast<std::uint16_t>(inf | 3)};
        for (std::int64_t i = 0, at = 1; i < 40; ++i, at = (at * 37 + 11) % x16.numel())
          set_bits(x16, at, specials[i % 7]);
        set_bits(x16, 0, inf | 5u);  // NaNs side by side, in one window
        set_bits(x16, 1, inf | 0x8006u);
        Tensor widened({planes, g.height, g.width}, DType::f32);
        cast(x16, widened);
        const Tensor& x = dtype == DType::f32 ? widened : x16;
        const float* v = widened.data<float>();
        Tensor y({planes, oh_n, ow_n}, dtype);
        max_pool2d_forward(x, g, y);
        Tensor dy32 = test::random_tensor({planes, oh_n, ow_n}, 22),
               dy({planes, oh_n, ow_n}, dtype);
        cast(dy32, dy);
        set_bits(dy, dy.numel() - 1, dtype == DType::f32 ? 0x80000000u : 0x8000u);  // a -0 stays -0
        Tensor dx({planes, g.height, g.width}, dtype);
        for (std::int64_t e = 0; e < dx.numel(); ++e) set_bits(dx, e, 0x3c3c);  // overwritten
        if (backward) max_pool2d_backward(x, g, dy, dx);
        std::vector<std::uint32_t> expected_dx(static_cast<std::size_t>(x.numel()), 0);
        const std::string where = std::string(dtype_name(dtype)) + " clone " + std::to_string(isa) +
                                  " window " + std::to_string(g.kernel_h) + "x" +
                                  std::to_string(g.kernel_w) + " stride " +
                                  std::to_string(g.stride) + " on " + std::to_string(g.height) +
                                  "x" + std::to_string(g.width);
        for (std::int64_t p = 0; p < planes; ++p)
          for (std::int64_t oh = 0; oh < oh_n; ++oh)
            for (std::int64_t ow = 0; ow < ow_n; ++ow) {
              std::int64_t last_nan = -1, first_nan = -1, first_max = -1;
              for (std::int64_t i = 0; i < g.kernel_h; ++i)
                for (std::int64_t j = 0; j < g.kernel_w; ++j) {
                  const std::int64_t at =
                      p * plane + (oh * g.stride + i) * g.width + ow * g.stride + j;
                  if (std::isnan(v[at])) {
                    last_nan = at;
                    if (first_nan < 0) first_nan = at;
                  } else if (first_max < 0 || v[at] > v[first_max]) {
                    first_max = at;
                  }
                }
              const std::int64_t o = (p * oh_n + oh) * ow_n + ow;
              ASSERT_EQ(bits_at(y, o), bits_at(x, last_nan >= 0 ? last_nan : first_max))
                  << where << ", output " << o;
              expected_dx[static_cast<std::size_t>(first_nan >= 0 ? first_nan : first_max)] =
                  bits_at(dy, o);
            }
        if (!backward) continue;
        for (std::int64_t e = 0; e < dx.numel(); ++e)
          ASSERT_EQ(bits_at(dx, e), expected_dx[static_cast<std::size_t>(e)])
              << where << ", element " << e;
      }
}

TEST(Pool2dDeathTest, SixteenBitBackwardRefusesOverlappingWindows) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Pool2dGeometry g{9, 11, 3, 3, 2};
  const Tensor x({1, 9, 11}, DType::bf16), dy({1, 4, 5}, DType::bf16);
  Tensor dx({1, 9, 11}, DType::bf16), dx32({1, 9, 11}, DType::f32);
  EXPECT_EXIT(max_pool2d_backward(x, g, dy, dx), testing::ExitedWithCode(3),
              "kernels::max_pool2d_backward: 16-bit max pooling's backward needs disjoint windows");
  EXPECT_EXIT(max_pool2d_backward(x, g, dy, dx32), testing::ExitedWithCode(3),
              "kernels::max_pool2d_backward: dx must be on the host shaped like x, in its dtype");
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
