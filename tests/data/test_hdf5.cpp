// Tests of the core HDF5 helpers (core/hdf5.hpp) that the data and checkpoint modules build on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

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

// String attributes are written fixed-length, so their bytes sit in the (checksummed) object header
// rather than the global heap; variable-length ones from other writers still read.
TEST(Hdf5, StringAttributesAreFixedLengthAndVariableOnesStillRead) {
  test::TempDir dir("hdf5-strings");
  const std::string path = dir.file("s.h5");
  auto lock = hdf5_lock();
  hdf5_quiet();
  const std::string big(200000, 'x');  // over the 64 KiB of a compact attribute message
  {
    Hdf5Handle access(H5Pcreate(H5P_FILE_ACCESS));
    ASSERT_GE(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), 0);
    Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()));
    ASSERT_TRUE(file.valid());
    hdf5_write_attribute(file.get(), "spaces", std::string("trailing  "));
    hdf5_write_attribute(file.get(), "empty", std::string());
    hdf5_write_attribute(file.get(), "utf8", std::string("\xc3\xa9t\xc3\xa9"));
    hdf5_write_attribute(file.get(), "big", big);
    hdf5_write_attribute(file.get(), "list", std::vector<std::string>{"long name", "", "b "});
    // What h5py writes for a Python str: a variable-length UTF-8 string.
    Hdf5Handle type(H5Tcopy(H5T_C_S1));
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    Hdf5Handle space(H5Screate(H5S_SCALAR));
    Hdf5Handle attribute(
        H5Acreate2(file.get(), "vlen", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
    const char* value = "from h5py";
    ASSERT_GE(H5Awrite(attribute.get(), type.get(), &value), 0);
  }
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(file.valid());
  for (const char* name : {"spaces", "empty", "big", "list"}) {
    Hdf5Handle attribute(H5Aopen(file.get(), name, H5P_DEFAULT));
    Hdf5Handle type(H5Aget_type(attribute.get()));
    EXPECT_EQ(H5Tget_class(type.get()), H5T_STRING) << name;
    EXPECT_EQ(H5Tis_variable_str(type.get()), 0) << name;
  }
  EXPECT_EQ(hdf5_read_string_attribute(file.get(), "spaces"), "trailing  ");
  EXPECT_EQ(hdf5_read_string_attribute(file.get(), "empty"), "");
  EXPECT_EQ(hdf5_read_string_attribute(file.get(), "utf8"), "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(hdf5_read_string_attribute(file.get(), "big"), big);
  EXPECT_EQ(hdf5_read_string_array_attribute(file.get(), "list"),
            (std::vector<std::string>{"long name", "", "b "}));
  EXPECT_EQ(hdf5_read_string_attribute(file.get(), "vlen"), "from h5py");
}

// The probe reads an intact file's metadata (in a child and in-process alike) and reports a
// header whose checksum fails.
TEST(Hdf5, ProbePassesIntactFilesAndReportsADamagedHeader) {
  test::TempDir dir("hdf5-probe");
  const std::string path = dir.file("p.h5");
  {
    auto lock = hdf5_lock();
    hdf5_quiet();
    Hdf5Handle access(H5Pcreate(H5P_FILE_ACCESS));
    ASSERT_GE(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), 0);
    Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()));
    const float values[4] = {1, 2, 3, 4};
    Hdf5Handle dataset = hdf5_write_dataset(file.get(), "g/data", H5T_IEEE_F32LE,
                                            H5T_NATIVE_FLOAT, {4}, values);
    hdf5_write_attribute(dataset.get(), "description", std::string("four floats"));
  }
  EXPECT_EQ(hdf5_probe_file(path), std::nullopt);
  hdf5_set_probe_isolation(false);
  EXPECT_EQ(hdf5_probe_file(path), std::nullopt);
  hdf5_set_probe_isolation(true);
  EXPECT_EQ(hdf5_probe_file(dir.file("missing.h5")), std::nullopt);  // the caller's open says why
  ASSERT_EQ(setenv("MPTRAIN_HDF5_PROBE_TIMEOUT", "soon", 1), 0);
  const std::string text = test::user_error_text([&] { hdf5_probe_file(path); });
  unsetenv("MPTRAIN_HDF5_PROBE_TIMEOUT");
  EXPECT_NE(text.find("MPTRAIN_HDF5_PROBE_TIMEOUT='soon' is not a positive number"),
            std::string::npos) << text;

  // Change one byte of the attribute's value, which lives in the dataset's object header (a
  // fixed-length string): the header's checksum fails.
  {
    std::fstream bytes(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::string content{std::istreambuf_iterator<char>(bytes), {}};
    const std::size_t at = content.find("four floats");
    ASSERT_NE(at, std::string::npos);
    bytes.clear();
    bytes.seekp(static_cast<std::streamoff>(at));
    bytes.put('F');
  }
  const auto damaged = hdf5_probe_file(path);
  ASSERT_TRUE(damaged.has_value());
  EXPECT_NE(damaged->find("checksum"), std::string::npos) << *damaged;
}

// Files on which HDF5 1.10 itself crashes or loops (found by fuzzing, kept in fuzz/regressions/):
// the probe's child dies or is killed, this process gets a reason, and goes on.
TEST(Hdf5, ProbeSurvivesFilesThatCrashOrHangTheLibrary) {
  const std::filesystem::path findings = std::filesystem::path(MPT_SOURCE_DIR) / "fuzz/regressions";
  for (const char* name :
       {"fuzz_inspect/libhdf5-H5A__close-segv.h5", "fuzz_data_file/libhdf5-H5HG_read-memcpy-overlap.h5",
        "fuzz_checkpoint/libhdf5-H5HG_read-overlap-checkpoint.h5"}) {
    const auto reason = hdf5_probe_file((findings / name).string());
    ASSERT_TRUE(reason.has_value()) << name;
    EXPECT_NE(reason->find("the HDF5 library crashed on it"), std::string::npos) << *reason;
  }
  ASSERT_EQ(setenv("MPTRAIN_HDF5_PROBE_TIMEOUT", "1.5", 1), 0);
  const auto started = std::chrono::steady_clock::now();
  const auto reason = hdf5_probe_file((findings / "fuzz_data_file/libhdf5-H5HG-timeout.h5").string());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  unsetenv("MPTRAIN_HDF5_PROBE_TIMEOUT");
  ASSERT_TRUE(reason.has_value());
  EXPECT_NE(reason->find("within 1.5 s"), std::string::npos) << *reason;
  EXPECT_LT(seconds, 10.0);
  // These two crash only under ASan (a huge malloc, an overlapping memcpy); without it HDF5
  // reports or reads them. Either way the probe returns.
  for (const char* name : {"fuzz_data_file/libhdf5-H5C_protect-huge-malloc.h5",
                           "fuzz_data_file/libhdf5-H5O__msg_iterate_real-overflow.h5"})
    (void)hdf5_probe_file((findings / name).string());
}

}  // namespace
}  // namespace mpt
