// Softmax cross-entropy: loss, correct count and gradient against float64, and stability.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/random.hpp"
#include "kernels/softmax_xent.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

using test::random_tensor;

Tensor make_labels(std::int64_t batch, int classes, std::uint64_t seed) {
  Tensor labels({batch}, DType::i32);
  const CounterRng rng(seed, 1);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] =
        static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(i), classes));
  return labels;
}

struct Reference {
  double loss_sum = 0;
  std::int64_t correct = 0;
  std::vector<double> grad;  // softmax - onehot, unscaled
};

Reference reference(const Tensor& logits, const Tensor& labels) {
  const std::int64_t batch = logits.dim(0), classes = logits.dim(1);
  Reference ref;
  ref.grad.resize(static_cast<std::size_t>(logits.numel()));
  for (std::int64_t i = 0; i < batch; ++i) {
    const float* x = logits.data<float>() + i * classes;
    const int label = labels.data<std::int32_t>()[i];
    double max = x[0];
    std::int64_t argmax = 0;
    for (std::int64_t j = 1; j < classes; ++j)
      if (x[j] > max) max = x[argmax = j];
    double sum = 0;
    for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(x[j] - max);
    ref.loss_sum += max + std::log(sum) - x[label];
    ref.correct += argmax == label;
    for (std::int64_t j = 0; j < classes; ++j)
      ref.grad[static_cast<std::size_t>(i * classes + j)] =
          std::exp(x[j] - max) / sum - (j == label ? 1.0 : 0.0);
  }
  return ref;
}

TEST(SoftmaxXent, MatchesFloat64Reference) {
  for (const auto& [batch, classes] :
       {std::pair<std::int64_t, int>{7, 11}, {128, 10}, {3, 1000}, {1, 1}}) {
    SCOPED_TRACE(::testing::Message() << batch << "x" << classes);
    const Tensor logits = random_tensor({batch, classes}, 11, -4.f, 4.f);
    const Tensor labels = make_labels(batch, classes, 12);
    const Reference ref = reference(logits, labels);
    const float scale = 1.f / static_cast<float>(batch);
    Tensor dlogits({batch, classes}, DType::f32);
    const XentStats stats = softmax_xent_forward_backward(logits, labels, dlogits, scale);
    // Per-row loss from f32 exp: relative error ~1e-7; 1e-6 relative is well above that and
    // well below any real mistake (a wrong sign or row gives O(1) differences).
    EXPECT_NEAR(stats.loss_sum, ref.loss_sum, 1e-6 * std::max(1.0, ref.loss_sum));
    EXPECT_EQ(stats.correct, ref.correct);
    for (std::size_t i = 0; i < ref.grad.size(); ++i)
      ASSERT_NEAR(dlogits.data<float>()[i], ref.grad[i] * scale, 1e-6 * scale) << "element " << i;
    const XentStats forward_only = softmax_xent_forward(logits, labels);
    EXPECT_EQ(forward_only.loss_sum, stats.loss_sum);
    EXPECT_EQ(forward_only.correct, stats.correct);
  }
}

TEST(SoftmaxXent, KnownValues) {
  // Two classes with equal logits: loss ln 2 per row, gradient (0.5 - onehot).
  Tensor logits({2, 2}, DType::f32);
  Tensor labels({2}, DType::i32);
  for (int i = 0; i < 4; ++i) logits.data<float>()[i] = 3.f;
  labels.data<std::int32_t>()[0] = 0;
  labels.data<std::int32_t>()[1] = 1;
  Tensor dlogits({2, 2}, DType::f32);
  const XentStats stats = softmax_xent_forward_backward(logits, labels, dlogits, 2.f);
  EXPECT_NEAR(stats.loss_sum, 2 * std::log(2.0), 1e-12);
  EXPECT_EQ(stats.correct, 1);  // ties go to the first maximum, class 0
  EXPECT_FLOAT_EQ(dlogits.data<float>()[0], -1.f);
  EXPECT_FLOAT_EQ(dlogits.data<float>()[1], 1.f);
  EXPECT_FLOAT_EQ(dlogits.data<float>()[2], 1.f);
  EXPECT_FLOAT_EQ(dlogits.data<float>()[3], -1.f);
}

TEST(SoftmaxXent, StableForHugeLogits) {
  // exp(1e4) overflows any float; a naive softmax gives inf/NaN. With the row maximum removed,
  // the loss is the small difference between logits, exact in double.
  Tensor logits({2, 3}, DType::f32);
  const float values[6] = {1e4f, 1e4f - 2.f, 1e4f + 1.f, -1e4f, -1e4f - 3.f, -1e4f + 0.5f};
  for (int i = 0; i < 6; ++i) logits.data<float>()[i] = values[i];
  Tensor labels({2}, DType::i32);
  labels.data<std::int32_t>()[0] = 0;
  labels.data<std::int32_t>()[1] = 2;
  Tensor dlogits({2, 3}, DType::f32);
  const XentStats stats = softmax_xent_forward_backward(logits, labels, dlogits, 1.f);
  // Row 0: shifts (-1, -3, 0), label 0: log(e^-1 + e^-3 + 1) + 1. Row 1: shifts (-0.5, -3.5, 0),
  // label 2: log(e^-0.5 + e^-3.5 + 1).
  const double expected = std::log(std::exp(-1.0) + std::exp(-3.0) + 1.0) + 1.0 +
                          std::log(std::exp(-0.5) + std::exp(-3.5) + 1.0);
  ASSERT_TRUE(std::isfinite(stats.loss_sum));
  EXPECT_NEAR(stats.loss_sum, expected, 1e-6);
  EXPECT_EQ(stats.correct, 1);
  const Reference ref = reference(logits, labels);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(std::isfinite(dlogits.data<float>()[i]));
    EXPECT_NEAR(dlogits.data<float>()[i], ref.grad[static_cast<std::size_t>(i)], 1e-6);
  }
}

TEST(SoftmaxXent, IgnoreLabelRowsAddNothingAndGetZeroGradient) {
  // Rows with kIgnoreLabel must equal a batch without them, and have an all-zero gradient row.
  const std::int64_t batch = 6, classes = 5;
  const Tensor logits = random_tensor({batch, classes}, 21, -3.f, 3.f);
  Tensor labels = make_labels(batch, classes, 22);
  // Make row 1 certainly "correct" if it were counted: its label is its argmax.
  {
    const float* x = logits.data<float>() + classes;
    std::int32_t argmax = 0;
    for (std::int32_t j = 1; j < classes; ++j)
      if (x[j] > x[argmax]) argmax = j;
    labels.data<std::int32_t>()[1] = argmax;
  }
  const XentStats all = softmax_xent_forward(logits, labels);
  const Reference full = reference(logits, labels);
  // Reference over the kept rows only.
  double kept_loss = 0;
  std::int64_t kept_correct = 0;
  for (std::int64_t row : {0, 2, 3, 5}) {
    const Tensor one_logits = Tensor::view(logits, row * classes, {1, classes});
    const Tensor one_label = Tensor::view(labels, row, {1});
    const Reference r = reference(one_logits, one_label);
    kept_loss += r.loss_sum;
    kept_correct += r.correct;
  }
  labels.data<std::int32_t>()[1] = kIgnoreLabel;
  labels.data<std::int32_t>()[4] = kIgnoreLabel;
  Tensor dlogits({batch, classes}, DType::f32);
  for (std::int64_t i = 0; i < dlogits.numel(); ++i) dlogits.data<float>()[i] = 7.f;  // stale
  const XentStats stats = softmax_xent_forward_backward(logits, labels, dlogits, 0.5f);
  EXPECT_NEAR(stats.loss_sum, kept_loss, 1e-6 * std::max(1.0, kept_loss));
  EXPECT_EQ(stats.correct, kept_correct);
  EXPECT_LT(stats.loss_sum, all.loss_sum);  // the ignored rows had a positive loss
  for (std::int64_t row = 0; row < batch; ++row)
    for (std::int64_t j = 0; j < classes; ++j) {
      const float got = dlogits.data<float>()[row * classes + j];
      if (row == 1 || row == 4)
        ASSERT_EQ(got, 0.f) << "row " << row;
      else
        ASSERT_NEAR(got, full.grad[static_cast<std::size_t>(row * classes + j)] * 0.5, 1e-6);
    }
  const XentStats forward_only = softmax_xent_forward(logits, labels);
  EXPECT_EQ(forward_only.loss_sum, stats.loss_sum);
  EXPECT_EQ(forward_only.correct, stats.correct);
}

TEST(SoftmaxXent, AllRowsIgnoredGiveZero) {
  const Tensor logits = random_tensor({3, 4}, 31, -1.f, 1.f);
  Tensor labels({3}, DType::i32);
  for (int i = 0; i < 3; ++i) labels.data<std::int32_t>()[i] = kIgnoreLabel;
  Tensor dlogits({3, 4}, DType::f32);
  const XentStats stats = softmax_xent_forward_backward(logits, labels, dlogits, 1.f);
  EXPECT_EQ(stats.loss_sum, 0.0);
  EXPECT_EQ(stats.correct, 0);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(dlogits.data<float>()[i], 0.f);
}

}  // namespace
}  // namespace mpt::kernels
