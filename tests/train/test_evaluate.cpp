// The counting behind eval, predict and the periodic evaluation: top-1, top-5 (ties, fewer than
// five classes, skipped samples) and the confusion matrix on hand-built logits, and its CSV.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "tests/test_util.hpp"
#include "train/evaluate.hpp"

namespace mpt::train {
namespace {

Tensor logits_of(const std::vector<std::vector<float>>& rows) {
  const auto classes = static_cast<std::int64_t>(rows.front().size());
  Tensor logits({static_cast<std::int64_t>(rows.size()), classes}, DType::f32);
  float* out = logits.data<float>();
  for (const auto& row : rows)
    for (float value : row) *out++ = value;
  return logits;
}

Tensor labels_of(const std::vector<std::int32_t>& values) {
  Tensor labels({static_cast<std::int64_t>(values.size())}, DType::i32);
  std::copy(values.begin(), values.end(), labels.data<std::int32_t>());
  return labels;
}

TEST(CountPredictions, TopOneTopFiveAndConfusionByHand) {
  // Six classes, so top-5 can miss. Row by row (true label -> what should count):
  const Tensor logits = logits_of({
      {0.1f, 0.9f, 0.3f, 0.2f, 0.5f, 0.0f},  // 1: predicted 1, top-1 and top-5 hit
      {5, 4, 3, 2, 1, 0},                    // 5: ranked 6th, misses top-5; predicted 0
      {5, 4, 3, 2, 1, 0},                    // 4: ranked 5th, top-5 hit only
      {1, 1, 0, 0, 0, 0},                    // 1: tie with class 0, which comes first: top-5 only
      {0, 0, 0, 2, 0, 0},                    // -1: a skipped sample counts nowhere
  });
  const Tensor labels = labels_of({1, 5, 4, 1, -1});
  EvalCounts counts(6);
  std::vector<std::int32_t> predicted(5, -7);
  count_predictions(logits, labels, counts, predicted.data());
  EXPECT_EQ(counts.top1, 1);
  EXPECT_EQ(counts.top5, 3);
  EXPECT_EQ(predicted, (std::vector<std::int32_t>{1, 0, 0, 0, 3}));
  std::vector<double> expected(36, 0.0);
  expected[1 * 6 + 1] = 1;  // true 1 predicted 1
  expected[5 * 6 + 0] = 1;
  expected[4 * 6 + 0] = 1;
  expected[1 * 6 + 0] = 1;  // the tie goes to the first class
  EXPECT_EQ(counts.confusion, expected);
  // Counts accumulate over batches.
  count_predictions(logits, labels, counts);
  EXPECT_EQ(counts.top1, 2);
  EXPECT_EQ(counts.top5, 6);
  EXPECT_EQ(counts.confusion[1 * 6 + 0], 2);
}

TEST(CountPredictions, FewerClassesThanFiveAlwaysHitTopK) {
  const Tensor logits = logits_of({{3, 2, 1}, {3, 2, 1}, {0, 1, 2}});
  EvalCounts counts(3);
  count_predictions(logits, labels_of({2, 0, 0}), counts);
  EXPECT_EQ(counts.top1, 1);
  EXPECT_EQ(counts.top5, 3);
  EXPECT_EQ(counts.confusion, (std::vector<double>{1, 0, 1, 0, 0, 0, 1, 0, 0}));
}

TEST(ConfusionCsv, LayoutRowsTrueColumnsPredicted) {
  test::TempDir dir("confusion-csv");
  EvalResult result;
  result.num_classes = 2;
  result.confusion = {5, 1, 2, 7};
  const std::string path = dir.file("confusion.csv");
  write_confusion_csv(result, path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "true/pred,0,1\n0,5,1\n1,2,7\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace mpt::train
