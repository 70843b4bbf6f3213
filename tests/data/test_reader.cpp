// Tests of DatasetReader: batches in any order (with duplicates), normalisation, float inputs,
// and every user error, whose message must name the file and the option or dataset.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/hdf5.hpp"
#include "core/random.hpp"
#include "data/data.hpp"
#include "kernels/normalize.hpp"
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
  bool normalisation_attributes = true;  // false: a plain file with no mean/std
  std::int64_t first_value = 0;          // sample i holds value_of(first_value + i, e)
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
      values[static_cast<std::size_t>(i * elements + e)] = value_of(spec.first_value + i, e);
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
  if (spec.normalisation_attributes) {
    hdf5_write_attribute(file.get(), "mean", spec.mean);
    hdf5_write_attribute(file.get(), "std", spec.std);
  }
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

// --data.normalize=device: a u8 batch holds the stored bytes, and kernels::normalize_u8 with
// u8_normalization() turns it into exactly (bit for bit) the f32 batch the reader would give.
TEST(DatasetReader, RawUint8BatchesAreTheStoredBytesAndNormaliseToTheF32Batch) {
  test::TempDir dir("reader-raw");
  FileSpec spec;
  spec.mean = 0.2860f;
  spec.std = 0.3530f;
  write_file(dir.file("d.h5"), spec);
  DatasetReader reader(dir.file("d.h5"), {});
  const std::vector<std::int64_t> indices{9, 3, 2, 4, 0, 8, 3, 7};
  Tensor raw({12, 2, 3}, DType::u8), raw_labels({12}, DType::i32);
  Tensor converted({12, 2, 3}, DType::f32), labels({12}, DType::i32);
  reader.read_batch(indices, raw, raw_labels);
  reader.read_batch(indices, converted, labels);
  for (std::size_t p = 0; p < indices.size(); ++p) {
    EXPECT_EQ(raw_labels.data<std::int32_t>()[p], labels.data<std::int32_t>()[p]);
    for (std::int64_t e = 0; e < 6; ++e)
      EXPECT_EQ(raw.data<std::uint8_t>()[p * 6 + e], value_of(indices[p], e)) << "position " << p;
  }
  EXPECT_EQ(raw.data<std::uint8_t>()[8 * 6], 0) << "rows past the batch are left alone";
  const U8Normalization normalization = u8_normalization(reader.info());
  Tensor normalized({12, 2, 3}, DType::f32);
  kernels::normalize_u8(raw, normalized, normalization.scale, normalization.shift);
  EXPECT_EQ(std::memcmp(normalized.data<float>(), converted.data<float>(), 8 * 6 * sizeof(float)), 0)
      << "the device path must train on the reader's very inputs";
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

// ---- several files as one dataset ---------------------------------------------------------------

// Three files of 3, 1 and 5 samples whose values continue each other: global sample g holds
// value_of(g, e), and label (g % 4) only where the files' own labels agree, so labels are set.
std::vector<std::string> write_parts(const test::TempDir& dir) {
  std::vector<std::string> paths;
  std::int64_t first = 0;
  for (std::int64_t n : {3, 1, 5}) {
    FileSpec spec;
    spec.samples_shape = {n, 2, 3};
    spec.labels_shape = {n};
    spec.first_value = first;
    spec.labels.clear();
    for (std::int64_t i = 0; i < n; ++i) spec.labels.push_back(static_cast<std::int32_t>((first + i) % 4));
    paths.push_back(dir.file("part-" + std::to_string(paths.size()) + ".h5"));
    write_file(paths.back(), spec);
    first += n;
  }
  return paths;
}

void expect_global_samples(DatasetReader& reader, const std::vector<std::int64_t>& indices) {
  Tensor samples({static_cast<std::int64_t>(indices.size()), 2, 3}, DType::f32);
  Tensor labels({static_cast<std::int64_t>(indices.size())}, DType::i32);
  reader.read_batch(indices, samples, labels);
  for (std::size_t p = 0; p < indices.size(); ++p) {
    EXPECT_EQ(labels.data<std::int32_t>()[p], indices[p] % 4) << "position " << p;
    for (std::int64_t e = 0; e < 6; ++e)
      ASSERT_NEAR(samples.data<float>()[p * 6 + e],
                  (value_of(indices[p], e) / 255.0f - 0.25f) / 0.5f, 1e-5)
          << "index " << indices[p] << " element " << e;
  }
}

TEST(DatasetReaderFiles, CommaListAndGlobActAsOneConcatenatedDataset) {
  test::TempDir dir("reader-multi");
  const auto paths = write_parts(dir);
  for (const std::string& spec :
       {paths[0] + "," + paths[1] + "," + paths[2], dir.file("part-*.h5"),
        paths[0] + ", " + dir.file("part-[12].h5")}) {
    SCOPED_TRACE(spec);
    for (bool direct : {true, false}) {
      ReaderOptions options;
      options.direct_reads = direct;
      DatasetReader reader(spec, options);
      EXPECT_EQ(reader.info().num_samples, 9);
      EXPECT_EQ(reader.info().files, paths);
      EXPECT_EQ(reader.info().path, paths[0] + "," + paths[1] + "," + paths[2]);
      // Runs crossing both boundaries (2,3,4 and 3..8), duplicates and any order.
      expect_global_samples(reader, {8, 2, 3, 4, 0, 3, 7, 5, 6, 1});
      expect_global_samples(reader, {3});
      expect_global_samples(reader, {0, 1, 2, 3, 4, 5, 6, 7, 8});
      if (direct)
        EXPECT_GT(reader.direct_samples_read(), 0);
      else
        EXPECT_EQ(reader.direct_samples_read(), 0);
    }
  }
}

TEST(DatasetReaderFiles, FilesThatDisagreeAreNamedBoth) {
  test::TempDir dir("reader-multi-bad");
  FileSpec spec;
  write_file(dir.file("a.h5"), spec);
  spec.samples_shape = {10, 3, 2};
  write_file(dir.file("shape.h5"), spec);
  spec = FileSpec{};
  spec.num_classes = 5;
  write_file(dir.file("classes.h5"), spec);
  spec = FileSpec{};
  spec.samples_file_type = H5T_IEEE_F32LE;
  write_file(dir.file("float.h5"), spec);
  spec = FileSpec{};
  spec.mean = 0.5f;
  write_file(dir.file("mean.h5"), spec);
  const std::string a = dir.file("a.h5");
  expect_open_error(a + "," + dir.file("shape.h5"),
                    {dir.file("shape.h5"), a, "'samples'", "(3,2)", "(2,3)", "must agree"});
  expect_open_error(a + "," + dir.file("classes.h5"), {dir.file("classes.h5"), "num_classes is 5"});
  expect_open_error(a + "," + dir.file("float.h5"), {dir.file("float.h5"), "has dtype"});
  expect_open_error(a + "," + dir.file("mean.h5"), {dir.file("mean.h5"), "mean/std"});
  expect_open_error(a + "," + dir.file("nothing-*.h5"),
                    {"no data file matches '" + dir.file("nothing-*.h5") + "'", "--data.train"});
  expect_open_error(a + "," + dir.file("absent.h5"), {dir.file("absent.h5"), "not found"});
  expect_open_error(" , ", {"no data file given", "--data.train"});
}

TEST(DatasetReaderFiles, OddSizesWithEveryShuffleModeReadWhatThePlanSays) {
  test::TempDir dir("reader-odd");
  for (std::int64_t n : {1, 13}) {
    FileSpec spec;
    spec.samples_shape = {n, 2, 3};
    spec.labels_shape = {n};
    write_file(dir.file("d.h5"), spec);
    DatasetReader reader(dir.file("d.h5"), {});
    const std::int64_t batch = n == 1 ? 1 : 5;  // 5 does not divide 13
    for (ShuffleMode mode : {ShuffleMode::global, ShuffleMode::window, ShuffleMode::none}) {
      ShardOptions options;
      options.shuffle = mode;
      options.shuffle_window = 4;
      options.drop_last = false;
      ShardPlan plan(n, batch, 1, 0, 2, options);
      EXPECT_EQ(plan.steps_per_epoch(), (n + batch - 1) / batch);
      std::vector<std::int64_t> indices;
      Tensor samples({batch, 2, 3}, DType::f32), labels({batch}, DType::i32);
      std::set<std::int64_t> seen;
      for (std::int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
        plan.batch_indices(0, step, indices);
        reader.read_batch(indices, samples, labels);
        for (std::size_t p = 0; p < indices.size(); ++p) {
          seen.insert(indices[p]);
          EXPECT_EQ(labels.data<std::int32_t>()[p], indices[p] % 4);
          EXPECT_NEAR(samples.data<float>()[p * 6 + 5],
                      (value_of(indices[p], 5) / 255.0f - 0.25f) / 0.5f, 1e-5);
        }
      }
      EXPECT_EQ(static_cast<std::int64_t>(seen.size()), n);
    }
  }
}

// ---- attributes from options -----------------------------------------------------------------------

TEST(DatasetReaderOptions, PlainFileTakesClassesAndNormalisationFromOptions) {
  test::TempDir dir("reader-plain");
  FileSpec spec;
  spec.num_classes = -1;  // what a bare h5py file looks like: just samples and labels
  spec.normalisation_attributes = false;
  spec.labels = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1};
  write_file(dir.file("plain.h5"), spec);
  expect_open_error(dir.file("plain.h5"), {dir.file("plain.h5"), "--data.num-classes"});
  ReaderOptions options;
  options.num_classes = 4;
  {
    DatasetReader reader(dir.file("plain.h5"), options);  // defaults: mean 0, std 1
    EXPECT_EQ(reader.info().num_classes, 4);
    Tensor samples({1, 2, 3}, DType::f32), labels({1}, DType::i32);
    const std::vector<std::int64_t> one{7};
    reader.read_batch(one, samples, labels);
    EXPECT_NEAR(samples.data<float>()[1], value_of(7, 1) / 255.0f, 1e-6);
  }
  options.mean = 0.1f;
  options.std = 0.2f;
  DatasetReader reader(dir.file("plain.h5"), options);
  Tensor samples({1, 2, 3}, DType::f32), labels({1}, DType::i32);
  const std::vector<std::int64_t> one{7};
  reader.read_batch(one, samples, labels);
  EXPECT_NEAR(samples.data<float>()[1], (value_of(7, 1) / 255.0f - 0.1f) / 0.2f, 1e-5);
  // Labels are checked against the class count the option gives.
  options.num_classes = 3;
  expect_open_error(dir.file("plain.h5"), {"label 3 at index 3", "[0, 3)"}, options);
}

TEST(DatasetReaderOptions, OptionsThatContradictTheFileAreErrors) {
  test::TempDir dir("reader-contradict");
  write_file(dir.file("d.h5"), FileSpec{});
  ReaderOptions options;
  options.num_classes = 5;
  expect_open_error(dir.file("d.h5"), {dir.file("d.h5"), "num_classes = 4", "--data.num-classes is 5"},
                    options);
  options = ReaderOptions{};
  options.mean = 0.3f;
  expect_open_error(dir.file("d.h5"), {dir.file("d.h5"), "--data.mean"}, options);
  options = ReaderOptions{};
  options.mean = 0.25f;  // agreeing with the file is fine
  DatasetReader reader(dir.file("d.h5"), options);
}

TEST(DatasetReaderOptions, SampleShapeReshapesWithTheSameElementCount) {
  test::TempDir dir("reader-reshape");
  write_file(dir.file("d.h5"), FileSpec{});
  ReaderOptions options;
  options.sample_shape = {6};
  DatasetReader reader(dir.file("d.h5"), options);
  EXPECT_EQ(reader.info().sample_shape, (Shape{6}));
  Tensor samples({1, 6}, DType::f32), labels({1}, DType::i32);
  const std::vector<std::int64_t> one{2};
  reader.read_batch(one, samples, labels);
  EXPECT_NEAR(samples.data<float>()[4], (value_of(2, 4) / 255.0f - 0.25f) / 0.5f, 1e-5);
  options.sample_shape = {4};
  expect_open_error(dir.file("d.h5"), {dir.file("d.h5"), "--data.sample-shape (4)", "'samples'"},
                    options);
}

// ---- non-finite samples --------------------------------------------------------------------------

TEST(DatasetReaderNonFinite, SkipZeroesTheRowIgnoresTheLabelAndCounts) {
  test::TempDir dir("reader-skip");
  FileSpec spec;
  spec.samples_file_type = H5T_IEEE_F32LE;
  spec.nan_in_sample_3 = true;
  write_file(dir.file("nan.h5"), spec);
  ReaderOptions options;
  options.on_nonfinite = NonFiniteAction::skip;
  DatasetReader reader(dir.file("nan.h5"), options);
  const std::vector<std::int64_t> indices{3, 0, 3, 4};
  Tensor samples({4, 2, 3}, DType::f32), labels({4}, DType::i32);
  for (std::int64_t i = 0; i < samples.numel(); ++i) samples.data<float>()[i] = 9.f;
  reader.read_batch(indices, samples, labels);
  EXPECT_EQ(reader.skipped_nonfinite(), 2);  // sample 3 twice in this batch
  for (std::size_t p : {0u, 2u}) {
    EXPECT_EQ(labels.data<std::int32_t>()[p], -1);
    for (int e = 0; e < 6; ++e) EXPECT_EQ(samples.data<float>()[p * 6 + e], 0.f);
  }
  EXPECT_EQ(labels.data<std::int32_t>()[1], 0);
  EXPECT_EQ(samples.data<float>()[1 * 6 + 2], value_of(0, 2));
  EXPECT_EQ(labels.data<std::int32_t>()[3], 0);
  EXPECT_EQ(samples.data<float>()[3 * 6 + 2], value_of(4, 2));
  reader.read_batch(std::span<const std::int64_t>(indices.data(), 1), samples, labels);
  EXPECT_EQ(reader.skipped_nonfinite(), 3);
  EXPECT_EQ(parse_nonfinite_action("skip"), NonFiniteAction::skip);
  EXPECT_NE(test::user_error_text([] { parse_nonfinite_action("drop"); }).find("--data.on-nonfinite"),
            std::string::npos);
}

TEST(DatasetReaderNonFinite, ErrorNamesFileDatasetAndIndexInAMultiFileDataset) {
  test::TempDir dir("reader-nan-multi");
  FileSpec spec;
  spec.samples_file_type = H5T_IEEE_F32LE;
  write_file(dir.file("a.h5"), spec);
  spec.nan_in_sample_3 = true;
  write_file(dir.file("b.h5"), spec);
  DatasetReader reader(dir.file("a.h5") + "," + dir.file("b.h5"), {});
  const std::vector<std::int64_t> indices{13};
  Tensor samples({1, 2, 3}, DType::f32), labels({1}, DType::i32);
  const std::string text = test::user_error_text([&] { reader.read_batch(indices, samples, labels); });
  for (const std::string& needle :
       std::vector<std::string>{"sample 3 of dataset 'samples'", dir.file("b.h5"), "index 13",
                                "--data.on-nonfinite=skip"})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in: " << text;
}

// ---- damaged files -----------------------------------------------------------------------------------

TEST(DatasetReaderErrors, FileTruncatedToHalfFailsCleanlyAtOpen) {
  test::TempDir dir("reader-truncated");
  SyntheticSpec synthetic;
  synthetic.train_samples = 2000;
  synthetic.test_samples = 10;
  prepare_synthetic(synthetic, dir.path());
  const std::string path = dir.file("train.h5");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  for (bool direct : {true, false}) {
    ReaderOptions options;
    options.direct_reads = direct;
    expect_open_error(path, {"cannot open data file '" + path + "'", "--data.train", "'samples'",
                             "'labels'", "truncated"},
                      options);
  }
  // Cut to less than the superblock: not recognisable as HDF5 any more.
  std::filesystem::resize_file(path, 4);
  expect_open_error(path, {path, "not an HDF5 file", "truncated"});
}

TEST(DatasetReaderErrors, FileTruncatedAfterOpenFailsCleanlyAtRead) {
  test::TempDir dir("reader-truncated-late");
  SyntheticSpec synthetic;
  synthetic.train_samples = 2000;
  synthetic.test_samples = 10;
  prepare_synthetic(synthetic, dir.path());
  const auto size = std::filesystem::file_size(dir.file("train.h5"));
  // Each pass starts from an intact copy: growing the cut file back would leave zeros where the
  // metadata at its end was, which the (checksummed) 1.8 format rightly reports at open.
  const std::string intact = dir.file("intact.h5");
  std::filesystem::copy_file(dir.file("train.h5"), intact);
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct" : "hdf5");
    // A new file (a new inode) per pass: HDF5 may keep the truncated file of the previous pass
    // open after its failed close, and would hand that stale file back for the same inode.
    const std::string path = dir.file(direct ? "train-direct.h5" : "train-hdf5.h5");
    std::filesystem::copy_file(intact, path, std::filesystem::copy_options::overwrite_existing);
    ReaderOptions options;
    options.direct_reads = direct;
    options.chunk_cache_bytes = 0;  // nothing cached, so the read must touch the file
    DatasetReader reader(path, options);
    std::filesystem::resize_file(path, size / 2);  // under the reader's feet
    const std::vector<std::int64_t> indices{1990, 1991, 1999};
    Tensor samples({3, 1, 28, 28}, DType::f32), labels({3}, DType::i32);
    const std::string text =
        test::user_error_text([&] { reader.read_batch(indices, samples, labels); });
    EXPECT_NE(text.find(path), std::string::npos) << text;
    EXPECT_NE(text.find("'samples'"), std::string::npos) << text;
    EXPECT_NE(text.find("truncated"), std::string::npos) << text;
  }
}

TEST(DatasetReader, DirectReadsMatchHdf5ReadsForChunkedAndContiguousFiles) {
  test::TempDir dir("reader-direct");
  SyntheticSpec synthetic;
  synthetic.train_samples = 500;
  synthetic.test_samples = 10;
  prepare_synthetic(synthetic, dir.path());  // chunked, 20 samples per chunk
  FileSpec spec;
  spec.samples_shape = {500, 2, 3};
  spec.labels_shape = {500};
  write_file(dir.file("contiguous.h5"), spec);  // hdf5_write_dataset: contiguous layout
  for (const std::string name : {"train.h5", "contiguous.h5"}) {
    SCOPED_TRACE(name);
    ReaderOptions direct_options, hdf5_options;
    hdf5_options.direct_reads = false;
    DatasetReader direct(dir.file(name), direct_options), hdf5(dir.file(name), hdf5_options);
    const Shape sample_shape = direct.info().sample_shape;
    std::vector<std::int64_t> indices;
    for (std::int64_t i = 15; i < 85; ++i) indices.push_back(i);   // spans chunk edges
    for (std::int64_t i : {499, 0, 250, 251, 19, 20}) indices.push_back(i);
    const auto count = static_cast<std::int64_t>(indices.size());
    Shape batch_shape{count};
    batch_shape.insert(batch_shape.end(), sample_shape.begin(), sample_shape.end());
    Tensor a(batch_shape, DType::f32), b(batch_shape, DType::f32);
    Tensor la({count}, DType::i32), lb({count}, DType::i32);
    direct.read_batch(indices, a, la);
    hdf5.read_batch(indices, b, lb);
    const auto unique = static_cast<std::int64_t>(std::set(indices.begin(), indices.end()).size());
    EXPECT_EQ(direct.direct_samples_read(), unique);  // duplicates are read once
    EXPECT_EQ(hdf5.direct_samples_read(), 0);
    EXPECT_EQ(hdf5.hdf5_samples_read(), unique);
    ASSERT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.size_bytes()), 0);
    ASSERT_EQ(std::memcmp(la.data<std::int32_t>(), lb.data<std::int32_t>(), la.size_bytes()), 0);
  }
}

}  // namespace
}  // namespace mpt::data

namespace mpt::data {
namespace {

// Dataset names left empty in the options come from the file's samples_dataset/labels_dataset
// attributes; an explicit option still wins.
TEST(DatasetReader, DatasetNamesFromFileAttributes) {
  test::TempDir dir("reader-names-attr");
  const std::string path = dir.file("named.h5");
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    std::vector<std::uint8_t> pixels(6 * 4);
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i);
    std::vector<std::int32_t> labels{0, 1, 2, 0, 1, 2};
    hdf5_write_dataset(file.get(), "images", H5T_STD_U8LE, H5T_NATIVE_UINT8, {6, 4}, pixels.data());
    hdf5_write_dataset(file.get(), "targets", H5T_STD_I32LE, H5T_NATIVE_INT32, {6}, labels.data());
    hdf5_write_attribute(file.get(), "samples_dataset", "images");
    hdf5_write_attribute(file.get(), "labels_dataset", "targets");
    hdf5_write_attribute(file.get(), "num_classes", std::int32_t{3});
  }
  DatasetReader reader(path, ReaderOptions{});
  EXPECT_EQ(reader.info().samples_name, "images");
  EXPECT_EQ(reader.info().labels_name, "targets");
  EXPECT_EQ(reader.info().num_samples, 6);
  ReaderOptions explicit_names;
  explicit_names.samples_name = "samples";
  const std::string text = test::user_error_text([&] { DatasetReader bad(path, explicit_names); });
  EXPECT_NE(text.find("no dataset 'samples'"), std::string::npos) << text;
}

}  // namespace
}  // namespace mpt::data
