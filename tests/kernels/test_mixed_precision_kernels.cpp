// The kernels added for 16-bit activations: ReLU on fp16/bf16 storage (exhaustively against
// widen -> f32 ReLU -> round), the fused round-and-widen recast, the finite test, bias-gradient
// accumulation over row blocks, and unscale_and_check's chunked widening.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.hpp"
#include "core/random.hpp"
#include "kernels/bias.hpp"
#include "kernels/cast.hpp"
#include "kernels/finite.hpp"
#include "kernels/relu.hpp"
#include "kernels/unscale_check.hpp"
#include "random_fill.hpp"

namespace mpt {
namespace {

float widen(DType dtype, std::uint16_t bits) {
  return dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}
std::uint16_t round_to(DType dtype, float value) {
  return dtype == DType::f16 ? float_to_half_bits(value) : float_to_bf16_bits(value);
}
std::uint16_t* bits_of(Tensor& t) { return static_cast<std::uint16_t*>(t.raw()); }

class SixteenBit : public testing::TestWithParam<DType> {};

TEST_P(SixteenBit, ReluOnStorageBitsEqualsF32ReluOfEveryValue) {
  const DType dtype = GetParam();
  // Every one of the 65536 bit patterns as x, and as y for the backward mask.
  Tensor x({65536}, dtype), y({65536}, dtype), dy({65536}, dtype), dx({65536}, dtype);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    bits_of(x)[b] = static_cast<std::uint16_t>(b);
    bits_of(dy)[b] = round_to(dtype, 1.f + static_cast<float>(b % 7));
  }
  kernels::relu_forward(x, y);
  kernels::relu_backward(x, dy, dx);  // x as the "forward output" covers every mask input
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float v = widen(dtype, static_cast<std::uint16_t>(b));
    const float relu = v < 0.f ? 0.f : v;  // the f32 kernel's rule: NaN and -0 pass through
    // A NaN keeps its exact bits here, where the round trip would quieten a signalling one.
    if (std::isnan(v))
      ASSERT_EQ(bits_of(y)[b], b) << std::hex << b;
    else
      ASSERT_EQ(bits_of(y)[b], round_to(dtype, relu)) << std::hex << b;
    const std::uint16_t grad = v > 0.f ? bits_of(dy)[b] : round_to(dtype, 0.f);
    ASSERT_EQ(bits_of(dx)[b], grad) << std::hex << b;
  }
}

TEST_P(SixteenBit, RoundAndWidenMatchesTheScalarConverters) {
  const DType dtype = GetParam();
  // Not a multiple of 8 (the F16C tail) and over one chunk (the parallel split).
  const std::int64_t n = 40003;
  Tensor src = test::random_tensor({n}, 5, -3.f, 3.f);
  float* s = src.data<float>();
  const float specials[] = {0.f,
                            -0.f,
                            65504.f,
                            65520.f,
                            1e9f,
                            -1e9f,
                            5.9604645e-8f,
                            2.98e-8f,
                            1e-6f,
                            1.f + 0x1p-11f,
                            1.f + 0x1p-8f,
                            1.f + 3 * 0x1p-11f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-40f};
  for (std::size_t i = 0; i < std::size(specials); ++i) s[i * 997] = specials[i];
  Tensor rounded({n}, dtype), widened({n}, DType::f32);
  kernels::round_and_widen(src, rounded, widened);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t expected = round_to(dtype, s[i]);
    ASSERT_EQ(bits_of(rounded)[i], expected) << "value " << s[i] << " at " << i;
    const float back = widened.data<float>()[i];
    if (std::isnan(s[i]))
      ASSERT_TRUE(std::isnan(back));
    else
      ASSERT_EQ(std::bit_cast<std::uint32_t>(back),
                std::bit_cast<std::uint32_t>(widen(dtype, expected)))
          << i;
  }
}

TEST_P(SixteenBit, AllFiniteFindsInfOrNanAnywhere) {
  const DType dtype = GetParam();
  for (const std::int64_t position : {0L, 16383L, 16384L, 39999L}) {
    for (const float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      Tensor t({40000}, dtype), f({40000}, DType::f32);
      for (std::int64_t i = 0; i < 40000; ++i) bits_of(t)[i] = round_to(dtype, 1e4f);
      EXPECT_TRUE(kernels::all_finite(t));
      EXPECT_TRUE(kernels::all_finite(f));
      bits_of(t)[position] = round_to(dtype, bad);
      f.data<float>()[position] = bad;
      EXPECT_FALSE(kernels::all_finite(t)) << bad << " at " << position;
      EXPECT_FALSE(kernels::all_finite(f)) << bad << " at " << position;
    }
  }
}

TEST_P(SixteenBit, UnscaleAndCheckWidensAcrossChunks) {
  const DType dtype = GetParam();
  const std::int64_t n = 40001;
  Tensor grads({n}, dtype), out({n}, DType::f32);
  for (std::int64_t i = 0; i < n; ++i)
    bits_of(grads)[i] = round_to(dtype, static_cast<float>(i % 61 - 30) * 8.f);
  std::vector<Tensor> inputs{grads}, outputs{out};
  ASSERT_TRUE(kernels::unscale_and_check(inputs, outputs, 0.125f));
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(out.data<float>()[i], static_cast<float>(i % 61 - 30)) << i;
  bits_of(grads)[n - 1] = round_to(dtype, std::numeric_limits<float>::infinity());
  EXPECT_FALSE(kernels::unscale_and_check(inputs, outputs, 0.125f));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SixteenBit, testing::Values(DType::f16, DType::bf16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::f16 ? "fp16" : "bf16");
                         });

TEST(BiasBackward, AccumulatesOverRowBlocks) {
  const Tensor dy = test::random_tensor({10, 7}, 3);
  Tensor whole({7}, DType::f32), blocks({7}, DType::f32);
  kernels::bias_add_backward(dy, whole);
  blocks.data<float>()[0] = 1e6f;  // stale contents: the first block must overwrite them
  kernels::bias_add_backward(Tensor::view(dy, 0, {4, 7}), blocks, /*accumulate=*/false);
  kernels::bias_add_backward(Tensor::view(dy, 28, {6, 7}), blocks, /*accumulate=*/true);
  for (int j = 0; j < 7; ++j)
    EXPECT_NEAR(blocks.data<float>()[j], whole.data<float>()[j], 1e-6) << j;
}

}  // namespace
}  // namespace mpt
