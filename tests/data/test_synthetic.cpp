// Tests of the synthetic data generator: determinism, slab independence, statistics, and a
// learnability proxy (a nearest-class-mean classifier must do far better than chance).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

struct Loaded {
  DatasetInfo info;
  std::vector<float> samples;  // normalised, as the trainer sees them
  std::vector<std::int32_t> labels;
};

Loaded load_all(const std::string& path) {
  DatasetReader reader(path, {});
  Loaded loaded;
  loaded.info = reader.info();
  const std::int64_t n = loaded.info.num_samples;
  Shape shape{n};
  shape.insert(shape.end(), loaded.info.sample_shape.begin(), loaded.info.sample_shape.end());
  Tensor samples(shape, DType::f32);
  Tensor labels({n}, DType::i32);
  std::vector<std::int64_t> indices(static_cast<std::size_t>(n));
  std::iota(indices.begin(), indices.end(), 0);
  reader.read_batch(indices, samples, labels);
  loaded.samples.assign(samples.data<float>(), samples.data<float>() + samples.numel());
  loaded.labels.assign(labels.data<std::int32_t>(), labels.data<std::int32_t>() + n);
  return loaded;
}

TEST(Synthetic, DeterministicInTheSeed) {
  test::TempDir dir("synthetic-seed");
  SyntheticSpec spec;
  spec.train_samples = 300;
  spec.test_samples = 100;
  prepare_synthetic(spec, dir.file("a"));
  prepare_synthetic(spec, dir.file("b"));
  spec.seed = 2;
  prepare_synthetic(spec, dir.file("c"));
  const Loaded a = load_all(dir.file("a/train.h5")), b = load_all(dir.file("b/train.h5")),
               c = load_all(dir.file("c/train.h5"));
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.samples, c.samples);
  EXPECT_EQ(a.info.sample_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(a.info.num_classes, 10);
  // The test split reuses the training split's normalisation.
  DatasetReader test_reader(dir.file("a/test.h5"), {});
  EXPECT_EQ(test_reader.info().mean, a.info.mean);
  EXPECT_EQ(test_reader.info().std, a.info.std);
  EXPECT_EQ(test_reader.info().num_samples, 100);
}

TEST(Synthetic, SampleIsAFunctionOfItsIndexNotOfTheSlabs) {
  // 64x64 samples make slabs of 1024, so 2500 samples span three slabs.
  test::TempDir dir("synthetic-slabs");
  SyntheticSpec spec;
  spec.sample_shape = {1, 64, 64};
  spec.train_samples = 2500;
  spec.test_samples = 10;
  prepare_synthetic(spec, dir.file("big"));
  spec.train_samples = 1500;
  prepare_synthetic(spec, dir.file("small"));
  DatasetReader big(dir.file("big/train.h5"), {}), small(dir.file("small/train.h5"), {});
  std::vector<std::int64_t> indices{0, 1023, 1024, 1499};
  Tensor s1({4, 1, 64, 64}, DType::f32), s2({4, 1, 64, 64}, DType::f32);
  Tensor l1({4}, DType::i32), l2({4}, DType::i32);
  big.read_batch(indices, s1, l1);
  small.read_batch(indices, s2, l2);
  // Normalisation differs (statistics of different sets), so compare the raw bytes back.
  for (std::int64_t i = 0; i < s1.numel(); ++i) {
    const float raw1 = (s1.data<float>()[i] * big.info().std + big.info().mean) * 255.0f;
    const float raw2 = (s2.data<float>()[i] * small.info().std + small.info().mean) * 255.0f;
    ASSERT_NEAR(raw1, raw2, 1e-2) << "element " << i;
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(l1.data<std::int32_t>()[i], l2.data<std::int32_t>()[i]);
}

TEST(Synthetic, StatisticsMatchTheDataAndClassesAreBalancedAndSeparable) {
  test::TempDir dir("synthetic-learn");
  SyntheticSpec spec;
  spec.train_samples = 2000;
  spec.test_samples = 500;
  spec.sample_shape = {784};  // the (N, D) layout
  prepare_synthetic(spec, dir.path());
  const Loaded train = load_all(dir.file("train.h5"));
  const Loaded test = load_all(dir.file("test.h5"));
  EXPECT_EQ(train.info.sample_shape, (Shape{784}));

  // Normalised with the file's own statistics, the training set has mean 0 and std 1.
  double sum = 0, sum_sq = 0;
  for (float v : train.samples) sum += v, sum_sq += double(v) * v;
  const double n = static_cast<double>(train.samples.size());
  EXPECT_NEAR(sum / n, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sum_sq / n - (sum / n) * (sum / n)), 1.0, 1e-3);

  // Labels roughly uniform.
  std::vector<int> counts(10, 0);
  for (auto label : train.labels) ++counts[static_cast<std::size_t>(label)];
  for (int count : counts) EXPECT_GT(count, 120) << "classes should be roughly balanced";

  // Nearest class mean: a linear classifier an MLP can certainly match.
  const std::size_t d = 784;
  std::vector<double> means(10 * d, 0.0);
  for (std::size_t i = 0; i < train.labels.size(); ++i)
    for (std::size_t e = 0; e < d; ++e)
      means[static_cast<std::size_t>(train.labels[i]) * d + e] += train.samples[i * d + e];
  for (std::size_t c = 0; c < 10; ++c)
    for (std::size_t e = 0; e < d; ++e) means[c * d + e] /= counts[c];
  int correct = 0;
  for (std::size_t i = 0; i < test.labels.size(); ++i) {
    double best = 1e300;
    int best_class = -1;
    for (int c = 0; c < 10; ++c) {
      double distance = 0;
      for (std::size_t e = 0; e < d; ++e) {
        const double diff = test.samples[i * d + e] - means[static_cast<std::size_t>(c) * d + e];
        distance += diff * diff;
      }
      if (distance < best) best = distance, best_class = c;
    }
    correct += best_class == test.labels[i];
  }
  EXPECT_GT(correct, 0.9 * static_cast<double>(test.labels.size()));
}

TEST(Synthetic, InvalidSpecsAreUserErrors) {
  test::TempDir dir("synthetic-invalid");
  SyntheticSpec spec;
  spec.train_samples = 0;
  EXPECT_NE(
      test::user_error_text([&] { prepare_synthetic(spec, dir.path()); }).find("train_samples"),
      std::string::npos);
  spec = SyntheticSpec{};
  spec.noise = 1.5f;
  EXPECT_NE(test::user_error_text([&] { prepare_synthetic(spec, dir.path()); }).find("noise"),
            std::string::npos);
  spec = SyntheticSpec{};
  spec.sample_shape = {1, 0, 28};
  EXPECT_NE(test::user_error_text([&] { prepare_synthetic(spec, dir.path()); }).find("shape"),
            std::string::npos);
}

}  // namespace
}  // namespace mpt::data
