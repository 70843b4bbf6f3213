// Prepares the real Fashion-MNIST from Debian's dataset-fashion-mnist package, when installed,
// and checks the result against the published facts (counts, balance, mean/std).
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

constexpr const char* kDebianDir = "/usr/share/datasets/fashion-mnist";

TEST(FashionMnist, PrepareFromDebianPackage) {
  if (!std::filesystem::exists(std::string(kDebianDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << kDebianDir << " is absent (install Debian's dataset-fashion-mnist)";
  test::TempDir dir("fashion-mnist");
  prepare_fashion_mnist(kDebianDir, dir.file("fm"));
  DatasetReader train(dir.file("fm/train.h5"), {});
  DatasetReader test(dir.file("fm/test.h5"), {});
  EXPECT_EQ(train.info().num_samples, 60000);
  EXPECT_EQ(test.info().num_samples, 10000);
  EXPECT_EQ(train.info().sample_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(train.info().num_classes, 10);
  EXPECT_NEAR(train.info().mean, 0.2860, 5e-4);
  EXPECT_NEAR(train.info().std, 0.3530, 5e-4);
  EXPECT_EQ(test.info().mean, train.info().mean);  // the test set uses the training statistics
  EXPECT_EQ(test.info().std, train.info().std);
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(dir.file("fm/train.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    EXPECT_EQ(hdf5_read_string_attribute(file.get(), "class_names").value_or("").substr(0, 19),
              "T-shirt/top,Trouser");
  }
  // Balanced: 6000 of each class in the training set.
  std::vector<std::int64_t> all(60000);
  std::iota(all.begin(), all.end(), 0);
  Tensor samples({60000, 1, 28, 28}, DType::f32), labels({60000}, DType::i32);
  train.read_batch(all, samples, labels);
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 60000; ++i)
    ++counts[static_cast<std::size_t>(labels.data<std::int32_t>()[i])];
  for (int count : counts) EXPECT_EQ(count, 6000);
}

TEST(FashionMnist, MissingSourceDirectoryIsAUserError) {
  test::TempDir dir("fashion-mnist-missing");
  const std::string text =
      test::user_error_text([&] { prepare_fashion_mnist(dir.file("nowhere"), dir.file("out")); });
  EXPECT_NE(text.find(dir.file("nowhere") + "/train-images-idx3-ubyte.gz"), std::string::npos)
      << text;
  EXPECT_NE(text.find("not found"), std::string::npos) << text;
  EXPECT_NE(text.find("dataset-fashion-mnist"), std::string::npos) << text;
}

}  // namespace
}  // namespace mpt::data
