// uint8 normalisation and in-place scaling against float64.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/normalize.hpp"
#include "kernels/scale.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

TEST(NormalizeU8, AllByteValuesWithMnistConstants) {
  const std::int64_t n = 3 * 256 + 17;
  Tensor in({n}, DType::u8);
  for (std::int64_t i = 0; i < n; ++i)
    in.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i * 7);
  Tensor out({n / 1, 1}, DType::f32);  // shapes may differ, element counts may not
  const double mean = 0.1307, stddev = 0.3081;
  const float scale = static_cast<float>(1.0 / (255.0 * stddev));
  const float shift = static_cast<float>(-mean / stddev);
  normalize_u8(in, out, scale, shift);
  for (std::int64_t i = 0; i < n; ++i) {
    const double expected = (in.data<std::uint8_t>()[i] / 255.0 - mean) / stddev;
    ASSERT_NEAR(out.data<float>()[i], expected, 1e-6 * std::max(1.0, std::fabs(expected))) << i;
  }
}

TEST(ScaleInplace, MultipliesEveryElement) {
  Tensor x = test::random_tensor({50001}, 3);
  const Tensor copy = test::random_tensor({50001}, 3);
  scale_inplace(x, 0.125f);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(x.data<float>()[i], copy.data<float>()[i] * 0.125f);
}

}  // namespace
}  // namespace mpt::kernels
