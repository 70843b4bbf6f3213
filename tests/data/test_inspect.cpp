// Tests of inspect_file on a data file, a foreign HDF5 file and files that are not HDF5.
#include <gtest/gtest.h>

#include <fstream>

#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

TEST(Inspect, DataFileShowsLayoutAttributesAndHistogram) {
  test::TempDir dir("inspect-data");
  SyntheticSpec spec;
  spec.train_samples = 200;
  spec.test_samples = 20;
  prepare_synthetic(spec, dir.path());
  const std::string text = inspect_file(dir.file("train.h5"));
  for (const char* needle :
       {"mptrain data file", "format_version 1", "/samples  uint8 (200,1,28,28)",
        "chunks (20,1,28,28)", "/labels  int32 (200)", "num_classes = 10",
        "sample_shape = [1, 28, 28]", "mptrain_format = \"mptrain-data\"",
        "label histogram:", "9: ", "description = "})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << text;
}

TEST(Inspect, ForeignHdf5FileAndBrokenDataFile) {
  test::TempDir dir("inspect-other");
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fcreate(dir.file("x.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    const double values[3] = {1.5, 2.5, 3.5};
    hdf5_write_dataset(file.get(), "group/values", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {3}, values);
    const std::int32_t samples[4] = {1, 2, 3, 4};
    hdf5_write_dataset(file.get(), "samples", H5T_STD_I32LE, H5T_NATIVE_INT32, {2, 2}, samples);
    hdf5_write_attribute(file.get(), "note", "made by a test");
  }
  const std::string text = inspect_file(dir.file("x.h5"));
  for (const char* needle : {"other HDF5 file", "/group/values  float64 (3)",
                             "note = \"made by a test\"", "not usable as training data"})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << text;
}

TEST(Inspect, MissingAndNonHdf5FilesAreUserErrors) {
  test::TempDir dir("inspect-errors");
  std::string text = test::user_error_text([&] { inspect_file(dir.file("none.h5")); });
  EXPECT_NE(text.find(dir.file("none.h5")), std::string::npos) << text;
  EXPECT_NE(text.find("not found"), std::string::npos) << text;
  std::ofstream(dir.file("plain.txt")) << "hello\n";
  text = test::user_error_text([&] { inspect_file(dir.file("plain.txt")); });
  EXPECT_NE(text.find(dir.file("plain.txt")), std::string::npos) << text;
  EXPECT_NE(text.find("not an HDF5 file"), std::string::npos) << text;
}

}  // namespace
}  // namespace mpt::data
