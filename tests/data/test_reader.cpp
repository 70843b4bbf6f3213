// Tests of DatasetReader: batches in any order (with duplicates), normalisation, float inputs,
// and every user error, whose message must name the file and the option or dataset.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numeric>

#include "core/hdf5.hpp"
#include "core/random.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

// A hand-made data file, so that each test controls exactly one defect.
struct FileSpec {
  Shape samples_shape{10, 2, 3};
  hid_t samples_file_type = H5T_STD_U8LE;
  Shape labels_shape{10};
  std::vector<std::int32_t> labels;  // default: i % num_classes
  std::int64_t num_classes = 4;      // < 0: attribute left out
  std::string samples_name = "samples";
  std::string labels_name = "labels";
  float mean = 0.25f, std = 0.5f;
  bool nan_in_sample_3 = false;
};

// Sample i, element e holds (i * 7 + e) % 251.
float value_of(std::int64_t i, std::int64_t e) { return static_cast<float>((i * 7 + e) % 251); }

void write_file(const std::string& path, const FileSpec& spec) {
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(file.valid());
  const std::int64_t n = spec.samples_shape.empty() ? 0 : spec.samples_shape[0];
  const std::int64_t elements = n > 0 ? shape_numel(spec.samples_shape) / n : 0;
  std::vector<float> values(static_cast<std::size_t>(shape_numel(spec.samples_shape)));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t e = 0; e < elements; ++e)
      values[static_cast<std::size_t>(i * elements + e)] = value_of(i, e);
  if (spec.nan_in_sample_3) values[static_cast<std::size_t>(3 * elements + 1)] = std::nanf("");
  hdf5_write_dataset(file.get(), spec.samples_name, spec.samples_file_type, H5T_NATIVE_FLOAT,
                     spec.samples_shape, values.data());
  std::vector<std::int32_t> labels = spec.labels;
  if (labels.empty()) {
    labels.resize(static_cast<std::size_t>(shape_numel(spec.labels_shape)));
    for (std::size_t i = 0; i < labels.size(); ++i)
      labels[i] = static_cast<std::int32_t>(
          i % static_cast<std::size_t>(std::max<std::int64_t>(spec.num_classes, 1)));
  }
  hdf5_write_dataset(file.get(), spec.labels_name, H5T_STD_I32LE, H5T_NATIVE_INT32,
                     spec.labels_shape, labels.data());
  if (spec.num_classes >= 0)
    hdf5_write_attribute(file.get(), "num_classes", static_cast<std::int32_t>(spec.num_classes));
  hdf5_write_attribute(file.get(), "mean", spec.mean);
  hdf5_write_attribute(file.get(), "std", spec.std);
}

// IEEE half precision as HDF5 describes it (what h5py writes for numpy.float16).
Hdf5Handle float16_type() {
  Hdf5Handle type(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(type.get(), 15, 10, 5, 0, 10);
  H5Tset_size(type.get(), 2);
  H5Tset_ebias(type.get(), 15);
  return type;
}

TEST(DatasetReader, BatchInAnyOrderWithDuplicatesAndNormalisation) {
  test::TempDir dir("reader-order");
  FileSpec spec;
  write_file(dir.file("d.h5"), spec);
  DatasetReader reader(dir.file("d.h5"), {});
  EXPECT_EQ(reader.info().num_samples, 10);
  EXPECT_EQ(reader.info().sample_shape, (Shape{2, 3}));
  EXPECT_EQ(reader.info().num_classes, 4);
  EXPECT_EQ(reader.info().path, dir.file("d.h5"));

  // Out of order, with duplicates and runs (2,3,4 and 8,9), into a larger-than-needed tensor.
  const std::vector<std::int64_t> indices{9, 3, 2, 4, 0, 8, 3, 7};
  Tensor samples({12, 2, 3}, DType::f32);
  Tensor labels({12}, DType::i32);
  for (int repeat = 0; repeat < 2; ++repeat) {  // second call reuses the scratch buffers
    reader.read_batch(indices, samples, labels);
    for (std::size_t p = 0; p < indices.size(); ++p) {
      EXPECT_EQ(labels.data<std::int32_t>()[p], indices[p] % 4);
      for (std::int64_t e = 0; e < 6; ++e) {
        const float expected = (value_of(indices[p], e) / 255.0f - 0.25f) / 0.5f;
        EXPECT_NEAR(samples.data<float>()[p * 6 + e], expected, 1e-5) << "position " << p;
      }
    }
  }
  // Rows past the batch are left alone.
  EXPECT_EQ(samples.data<float>()[8 * 6], 0.0f);
}

TEST(DatasetReader, RandomBatchesMatchSingleReads) {
  test::TempDir dir("reader-random");
  SyntheticSpec synthetic;
  synthetic.train_samples = 1000;
  synthetic.test_samples = 10;
  prepare_synthetic(synthetic, dir.path());
  DatasetReader reader(dir.file("train.h5"), {});
  const CounterRng rng(5, 0);
  std::vector<std::int64_t> indices(64);
  for (std::size_t i = 0; i < indices.size(); ++i)
    indices[i] = static_cast<std::int64_t>(rng.below(i, 1000));
  Tensor batch({64, 1, 28, 28}, DType::f32), batch_labels({64}, DType::i32);
  reader.read_batch(indices, batch, batch_labels);
  Tensor one({1, 1, 28, 28}, DType::f32), one_label({1}, DType::i32);
  for (std::size_t p = 0; p < indices.size(); ++p) {
    reader.read_batch(std::span<const std::int64_t>(&indices[p], 1), one, one_label);
    ASSERT_EQ(one_label.data<std::int32_t>()[0], batch_labels.data<std::int32_t>()[p]);
    for (int e = 0; e < 784; ++e) ASSERT_EQ(one.data<float>()[e], batch.data<float>()[p * 784 + e]);
  }
}

TEST(DatasetReader, Float32AndFloat16SamplesAreCopied) {
  test::TempDir dir("reader-float");
  FileSpec spec;
  spec.samples_file_type = H5T_IEEE_F32LE;
  write_file(dir.file("f32.h5"), spec);
  Hdf5Handle half = float16_type();
  spec.samples_file_type = half.get();
  write_file(dir.file("f16.h5"), spec);
  for (const char* name : {"f32.h5", "f16.h5"}) {
    DatasetReader reader(dir.file(name), {});
    EXPECT_EQ(reader.info().sample_dtype, std::string(name) == "f32.h5" ? DType::f32 : DType::f16);
    std::vector<std::int64_t> indices{5, 1};
    Tensor samples({2, 2, 3}, DType::f32), labels({2}, DType::i32);
    reader.read_batch(indices, samples, labels);
    for (std::int64_t e = 0; e < 6; ++e) {
      EXPECT_EQ(samples.data<float>()[e], value_of(5, e)) << name;  // small integers: exact in f16
      EXPECT_EQ(samples.data<float>()[6 + e], value_of(1, e)) << name;
    }
  }
}

TEST(DatasetReader, NonFiniteFloatSampleNamesFileAndIndex) {
  test::TempDir dir("reader-nan");
  FileSpec spec;
  spec.samples_file_type = H5T_IEEE_F32LE;
  spec.nan_in_sample_3 = true;
  write_file(dir.file("nan.h5"), spec);
  DatasetReader reader(dir.file("nan.h5"), {});
  std::vector<std::int64_t> indices{0, 3};
  Tensor samples({2, 2, 3}, DType::f32), labels({2}, DType::i32);
  const std::string text =
      test::user_error_text([&] { reader.read_batch(indices, samples, labels); });
  EXPECT_NE(text.find(dir.file("nan.h5")), std::string::npos) << text;
  EXPECT_NE(text.find("sample 3"), std::string::npos) << text;
}

// Asserts that opening PATH fails with a message containing every one of NEEDLES.
void expect_open_error(const std::string& path, const std::vector<std::string>& needles,
                       ReaderOptions options = {}) {
  const std::string text = test::user_error_text([&] { DatasetReader reader(path, options); });
  for (const auto& needle : needles)
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in: " << text;
}

TEST(DatasetReaderErrors, MissingFile) {
  test::TempDir dir("reader-missing");
  expect_open_error(dir.file("absent.h5"), {"data file '" + dir.file("absent.h5") + "' not found",
                                            "--data.train", "mptrain prepare fashion-mnist"});
  ReaderOptions options;
  options.option_prefix = "--data.test";
  expect_open_error(dir.file("absent.h5"), {"--data.test"}, options);
}

TEST(DatasetReaderErrors, NotHdf5) {
  test::TempDir dir("reader-nothdf5");
  std::ofstream(dir.file("text.h5")) << "just some text, not HDF5\n";
  expect_open_error(dir.file("text.h5"), {dir.file("text.h5"), "not an HDF5 file", "--data.train"});
}

TEST(DatasetReaderErrors, WrongDatasetNameListsWhatExists) {
  test::TempDir dir("reader-name");
  FileSpec spec;
  spec.samples_name = "images";
  write_file(dir.file("d.h5"), spec);
  expect_open_error(dir.file("d.h5"), {dir.file("d.h5"), "--data.train", "no dataset 'samples'",
                                       "images", "labels", "--data.samples=NAME"});
  ReaderOptions options;
  options.samples_name = "images";
  options.labels_name = "targets";
  expect_open_error(dir.file("d.h5"), {"no dataset 'targets'", "--data.labels=NAME"}, options);
  options.labels_name = "labels";
  DatasetReader reader(dir.file("d.h5"), options);  // the right names open fine
  EXPECT_EQ(reader.info().samples_name, "images");
}

TEST(DatasetReaderErrors, LabelsOutOfRangeNameIndexAndValue) {
  test::TempDir dir("reader-range");
  FileSpec spec;
  spec.labels = {0, 1, 2, 3, 0, 1, 7, 3, 0, -1};
  write_file(dir.file("d.h5"), spec);
  expect_open_error(dir.file("d.h5"),
                    {dir.file("d.h5"), "--data.train", "'labels'", "label 7 at index 6", "[0, 4)"});
}

TEST(DatasetReaderErrors, WrongRankAndShapeMismatch) {
  test::TempDir dir("reader-rank");
  FileSpec spec;
  spec.samples_shape = {10};
  write_file(dir.file("rank1.h5"), spec);
  expect_open_error(dir.file("rank1.h5"),
                    {dir.file("rank1.h5"), "'samples'", "(10)", "at least 2 dimensions"});
  spec = FileSpec{};
  spec.labels_shape = {10, 1};
  write_file(dir.file("labels2d.h5"), spec);
  expect_open_error(dir.file("labels2d.h5"), {dir.file("labels2d.h5"), "'labels'", "(10,1)"});
  spec = FileSpec{};
  spec.labels_shape = {9};
  write_file(dir.file("short.h5"), spec);
  expect_open_error(dir.file("short.h5"), {dir.file("short.h5"), "9 labels", "10 samples"});
}

TEST(DatasetReaderErrors, MissingNumClassesUnsupportedDtypeAndEmpty) {
  test::TempDir dir("reader-attrs");
  FileSpec spec;
  spec.num_classes = -1;
  write_file(dir.file("noclasses.h5"), spec);
  expect_open_error(dir.file("noclasses.h5"),
                    {dir.file("noclasses.h5"), "--data.train", "'num_classes'", "f.attrs"});
  spec = FileSpec{};
  spec.samples_file_type = H5T_STD_I16LE;
  write_file(dir.file("int16.h5"), spec);
  expect_open_error(dir.file("int16.h5"),
                    {dir.file("int16.h5"), "int16", "uint8, float32 or float16"});
  spec = FileSpec{};
  spec.samples_shape = {0, 4};
  spec.labels_shape = {0};
  write_file(dir.file("empty.h5"), spec);
  expect_open_error(dir.file("empty.h5"), {dir.file("empty.h5"), "N = 0"});
}

TEST(DatasetReaderErrors, CheckpointPassedAsData) {
  test::TempDir dir("reader-kind");
  FileSpec spec;
  write_file(dir.file("d.h5"), spec);
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(dir.file("d.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    hdf5_write_attribute(file.get(), "mptrain_format", "mptrain-checkpoint");
  }
  expect_open_error(dir.file("d.h5"),
                    {dir.file("d.h5"), "mptrain-checkpoint", "not an mptrain data file"});
}

}  // namespace
}  // namespace mpt::data
