// Tests of the core HDF5 helpers (core/hdf5.hpp) that the data and checkpoint modules build on.
#include <gtest/gtest.h>

#include "core/hdf5.hpp"
#include "tests/test_util.hpp"

namespace mpt {
namespace {

TEST(Hdf5, AttributesRoundTrip) {
  test::TempDir dir("hdf5-attributes");
  const std::string path = dir.file("a.h5");
  auto lock = hdf5_lock();
  hdf5_quiet();
  {
    Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    hdf5_write_attribute(file.get(), "i32", std::int32_t{-7});
    hdf5_write_attribute(file.get(), "i64", std::int64_t{1} << 40);
    hdf5_write_attribute(file.get(), "u32", std::uint32_t{0xDEADBEEF});
    hdf5_write_attribute(file.get(), "f", 0.25f);
    hdf5_write_attribute(file.get(), "s", "hello, world");
    hdf5_write_attribute(file.get(), "s", std::string("replaced"));  // replaces, not fails
    hdf5_write_attribute(file.get(), "shape", std::vector<std::int64_t>{1, 28, 28});
    hdf5_write_attribute(file.get(), "names", std::vector<std::string>{"a/b", "", "c"});
    const float values[6] = {1, 2, 3, 4, 5, 6};
    Hdf5Handle dataset = hdf5_write_dataset(file.get(), "g/h/data", H5T_IEEE_F32LE,
                                            H5T_NATIVE_FLOAT, {2, 3}, values, {1, 3});
    ASSERT_TRUE(dataset.valid());
  }
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(file.valid());
  EXPECT_EQ(hdf5_read_int_attribute(file.get(), "i32"), -7);
  EXPECT_EQ(hdf5_read_int_attribute(file.get(), "i64"), std::int64_t{1} << 40);
  EXPECT_EQ(hdf5_read_int_attribute(file.get(), "u32"), 0xDEADBEEF);
  EXPECT_EQ(hdf5_read_float_attribute(file.get(), "f"), 0.25);
  EXPECT_EQ(hdf5_read_float_attribute(file.get(), "i32"), -7.0);  // integers read as floats too
  EXPECT_EQ(hdf5_read_string_attribute(file.get(), "s"), "replaced");
  EXPECT_EQ(hdf5_read_int_array_attribute(file.get(), "shape"),
            (std::vector<std::int64_t>{1, 28, 28}));
  EXPECT_EQ(hdf5_read_string_array_attribute(file.get(), "names"),
            (std::vector<std::string>{"a/b", "", "c"}));
  EXPECT_FALSE(hdf5_read_int_attribute(file.get(), "missing").has_value());
  EXPECT_FALSE(hdf5_read_int_attribute(file.get(), "s").has_value());  // wrong class
  EXPECT_FALSE(hdf5_read_string_attribute(file.get(), "i32").has_value());
  EXPECT_FALSE(hdf5_read_int_attribute(file.get(), "shape").has_value());  // not a scalar

  EXPECT_TRUE(hdf5_has_link(file.get(), "g/h/data"));
  EXPECT_TRUE(hdf5_has_link(file.get(), "g"));
  EXPECT_FALSE(hdf5_has_link(file.get(), "g/x/data"));  // missing intermediate group: no failure
  EXPECT_FALSE(hdf5_has_link(file.get(), "g/h/data/deeper"));
  Hdf5Handle dataset(H5Dopen2(file.get(), "g/h/data", H5P_DEFAULT));
  EXPECT_EQ(hdf5_dataset_shape(dataset.get()), (Shape{2, 3}));
  float back[6] = {};
  ASSERT_GE(hdf5_read_dataset(dataset.get(), H5T_NATIVE_FLOAT, back), 0);
  EXPECT_EQ(back[5], 6.0f);
  Hdf5Handle type(H5Dget_type(dataset.get()));
  EXPECT_EQ(hdf5_type_name(type.get()), "float32");
}

TEST(Hdf5, HandleClosesAndMoves) {
  auto lock = hdf5_lock();
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  const hid_t id = space.get();
  ASSERT_GT(H5Iis_valid(id), 0);
  Hdf5Handle moved(std::move(space));
  EXPECT_FALSE(space.valid());
  EXPECT_EQ(moved.get(), id);
  moved.reset();
  EXPECT_LE(H5Iis_valid(id), 0);
}

TEST(Hdf5, QuietKeepsFailuresToOneLineAndRecordsTheCause) {
  hdf5_quiet();
  auto lock = hdf5_lock();
  testing::internal::CaptureStderr();
  const hid_t file = H5Fopen("/nonexistent/mpt-no-such-file.h5", H5F_ACC_RDONLY, H5P_DEFAULT);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_LT(file, 0);
  EXPECT_EQ(printed, "");  // without hdf5_quiet() HDF5 prints its whole error stack here
  EXPECT_FALSE(hdf5_last_error().empty());
}

}  // namespace
}  // namespace mpt
