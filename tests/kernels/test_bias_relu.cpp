// Bias add and ReLU, forward and backward, against float64 references.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/bias.hpp"
#include "kernels/relu.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

using test::random_tensor;

TEST(BiasAdd, ForwardAddsBiasToEveryRow) {
  Tensor y = random_tensor({37, 300}, 1);  // 300 > one column block of the backward
  const Tensor y0 = random_tensor({37, 300}, 1);
  const Tensor bias = random_tensor({300}, 2);
  bias_add_forward(y, bias);
  for (std::int64_t i = 0; i < 37; ++i)
    for (std::int64_t j = 0; j < 300; ++j)
      ASSERT_FLOAT_EQ(y.data<float>()[i * 300 + j],
                      y0.data<float>()[i * 300 + j] + bias.data<float>()[j]);
}

TEST(BiasAdd, BackwardOverwritesWithColumnSums) {
  for (const auto& [rows, cols] :
       {std::pair<std::int64_t, std::int64_t>{37, 300}, {1, 1}, {128, 10}, {5, 513}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const Tensor dy = random_tensor({rows, cols}, 3);
    Tensor dbias = random_tensor({cols}, 4, 100.f, 200.f);  // garbage that must be overwritten
    bias_add_backward(dy, dbias);
    for (std::int64_t j = 0; j < cols; ++j) {
      double sum = 0, size = 0;
      for (std::int64_t i = 0; i < rows; ++i) {
        sum += dy.data<float>()[i * cols + j];
        size += std::fabs(dy.data<float>()[i * cols + j]);
      }
      // Sequential f32 summation of ROWS terms: error <= ROWS * 2^-24 * sum |dy|.
      ASSERT_NEAR(dbias.data<float>()[j], sum, static_cast<double>(rows) * 0x1p-24 * size)
          << "column " << j;
    }
  }
}

TEST(Relu, ForwardClampsNegativesAndKeepsNaN) {
  Tensor x = random_tensor({1000}, 5);
  x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  Tensor y({1000}, DType::f32);
  relu_forward(x, y);
  for (std::int64_t i = 0; i < 1000; ++i) {
    if (i == 7) {
      EXPECT_TRUE(std::isnan(y.data<float>()[i]));
      continue;
    }
    const float v = x.data<float>()[i];
    ASSERT_EQ(y.data<float>()[i], v > 0 ? v : 0.f) << i;
  }
}

TEST(Relu, ForwardInPlace) {
  Tensor x = random_tensor({40000}, 6);  // several chunks
  const Tensor copy = random_tensor({40000}, 6);
  relu_forward(x, x);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(x.data<float>()[i], std::max(copy.data<float>()[i], 0.f));
}

TEST(Relu, BackwardMasksByOutput) {
  const Tensor x = random_tensor({4, 777}, 7);
  Tensor y({4, 777}, DType::f32);
  relu_forward(x, y);
  Tensor dy = random_tensor({4, 777}, 8);
  const Tensor dy_copy = random_tensor({4, 777}, 8);
  Tensor dx({4, 777}, DType::f32);
  relu_backward(y, dy, dx);
  std::int64_t passed = 0;
  for (std::int64_t i = 0; i < dx.numel(); ++i) {
    const float expected = x.data<float>()[i] > 0 ? dy.data<float>()[i] : 0.f;
    ASSERT_EQ(dx.data<float>()[i], expected);
    passed += x.data<float>()[i] > 0;
  }
  EXPECT_GT(passed, 0);
  EXPECT_LT(passed, dx.numel());
  relu_backward(y, dy, dy);  // dx aliasing dy
  for (std::int64_t i = 0; i < dy.numel(); ++i)
    ASSERT_EQ(dy.data<float>()[i], x.data<float>()[i] > 0 ? dy_copy.data<float>()[i] : 0.f);
}

}  // namespace
}  // namespace mpt::kernels
