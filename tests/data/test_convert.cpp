// Tests of the npy and csv converters and of synthetic --dtype: round trips through
// DatasetReader, and every malformed input, whose message must name the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

// Writes a .npy file by hand, as numpy.save does: magic, version, padded header, raw data.
void write_npy(const std::string& path, const std::string& descr, const Shape& shape,
               const void* data, std::size_t bytes, int major = 1, bool fortran = false,
               std::size_t drop_bytes = 0) {
  std::string shape_text = "(";
  for (auto extent : shape) shape_text += std::to_string(extent) + ", ";
  if (shape.size() > 1) shape_text.resize(shape_text.size() - 2);
  if (shape.size() == 1) shape_text.pop_back();  // "(5,)"
  shape_text += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " +
                       (fortran ? "True" : "False") + ", 'shape': " + shape_text + ", }";
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY", 6);
  out.put(static_cast<char>(major));
  out.put(0);
  const auto length = static_cast<std::uint32_t>(header.size());
  for (std::size_t b = 0; b < (major == 1 ? 2u : 4u); ++b)
    out.put(static_cast<char>((length >> (8 * b)) & 0xFF));
  out << header;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes - drop_bytes));
}

// 7 samples of 2x3: sample i element e = (i * 6 + e) * 3 % 256, labels i % 3.
struct ByteData {
  std::vector<std::uint8_t> pixels;
  std::vector<std::int64_t> labels;
  ByteData() {
    for (int i = 0; i < 7; ++i) {
      for (int e = 0; e < 6; ++e) pixels.push_back(static_cast<std::uint8_t>((i * 6 + e) * 3 % 256));
      labels.push_back(i % 3);
    }
  }
};

void expect_reads(const std::string& path, const Shape& sample_shape, DType dtype,
                  const std::function<float(int, int)>& expected_value,
                  const std::function<int(int)>& expected_label, int n, int classes) {
  DatasetReader reader(path, {});
  const DatasetInfo& info = reader.info();
  EXPECT_EQ(info.num_samples, n);
  EXPECT_EQ(info.sample_shape, sample_shape);
  EXPECT_EQ(info.sample_dtype, dtype);
  EXPECT_EQ(info.num_classes, classes);
  const std::int64_t elements = shape_numel(sample_shape);
  std::vector<std::int64_t> indices(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) indices[static_cast<std::size_t>(i)] = n - 1 - i;
  Shape batch{n};
  batch.insert(batch.end(), sample_shape.begin(), sample_shape.end());
  Tensor samples(batch, DType::f32), labels({n}, DType::i32);
  reader.read_batch(indices, samples, labels);
  for (int p = 0; p < n; ++p) {
    const int i = n - 1 - p;
    EXPECT_EQ(labels.data<std::int32_t>()[p], expected_label(i));
    for (int e = 0; e < elements; ++e) {
      const float raw = expected_value(i, e);
      const float got = samples.data<float>()[p * elements + e];
      const float want = dtype == DType::u8 ? (raw / 255.0f - info.mean) / info.std : raw;
      ASSERT_NEAR(got, want, 1e-4f * std::max(1.0f, std::fabs(want))) << "sample " << i << " e " << e;
    }
  }
}

std::string error_text(const std::function<void()>& body) { return test::user_error_text(body); }

void expect_contains(const std::string& text, const std::vector<std::string>& needles) {
  for (const auto& needle : needles)
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in: " << text;
}

TEST(ConvertNpy, Uint8RoundTripWithReshapeAndStatistics) {
  test::TempDir dir("npy-u8");
  ByteData data;
  write_npy(dir.file("x.npy"), "|u1", {7, 2, 3}, data.pixels.data(), data.pixels.size());
  write_npy(dir.file("y.npy"), "<i8", {7}, data.labels.data(), data.labels.size() * 8, 2);
  ArrayConvertOptions options;
  convert_npy(dir.file("x.npy"), dir.file("y.npy"), dir.file("out/train.h5"), options);
  auto value = [&](int i, int e) { return static_cast<float>(data.pixels[static_cast<std::size_t>(i * 6 + e)]); };
  auto label = [](int i) { return i % 3; };
  expect_reads(dir.file("out/train.h5"), {2, 3}, DType::u8, value, label, 7, 3);
  // mean/std come from the pixels; --stats-from copies them; --shape regroups; --classes widens.
  options.sample_shape = {6};
  options.num_classes = 5;
  options.stats_from = dir.file("out/train.h5");
  convert_npy(dir.file("x.npy"), dir.file("y.npy"), dir.file("test.h5"), options);
  expect_reads(dir.file("test.h5"), {6}, DType::u8, value, label, 7, 5);
  DatasetReader train(dir.file("out/train.h5"), {}), test(dir.file("test.h5"), {});
  EXPECT_EQ(train.info().mean, test.info().mean);
  EXPECT_EQ(train.info().std, test.info().std);
  double sum = 0;
  for (auto p : data.pixels) sum += p;
  EXPECT_NEAR(train.info().mean, sum / data.pixels.size() / 255.0, 1e-6);
}

TEST(ConvertNpy, Float32AndFloat16RoundTripWithInt32Labels) {
  test::TempDir dir("npy-float");
  std::vector<float> values;
  std::vector<std::uint16_t> halves;
  for (int i = 0; i < 5 * 4; ++i) values.push_back(static_cast<float>(i) * 0.25f - 2.0f);
  std::vector<std::int32_t> labels{0, 1, 1, 0, 1};
  write_npy(dir.file("x.npy"), "<f4", {5, 4}, values.data(), values.size() * 4);
  write_npy(dir.file("y.npy"), "<i4", {5}, labels.data(), labels.size() * 4);
  convert_npy(dir.file("x.npy"), dir.file("y.npy"), dir.file("f32.h5"), {});
  auto value = [&](int i, int e) { return values[static_cast<std::size_t>(i * 4 + e)]; };
  auto label = [&](int i) { return labels[static_cast<std::size_t>(i)]; };
  expect_reads(dir.file("f32.h5"), {4}, DType::f32, value, label, 5, 2);
  // float16 bits of v = k/4 - 2 for k < 20, computed exactly.
  for (float v : values) {
    std::uint16_t bits = 0;
    if (v != 0.0f) {
      const float magnitude = std::fabs(v);
      int exponent = static_cast<int>(std::floor(std::log2(magnitude)));
      const float mantissa = magnitude / std::ldexp(1.0f, exponent) - 1.0f;
      bits = static_cast<std::uint16_t>(((exponent + 15) << 10) |
                                        static_cast<int>(std::lround(mantissa * 1024)));
      if (v < 0) bits |= 0x8000;
    }
    halves.push_back(bits);
  }
  write_npy(dir.file("h.npy"), "<f2", {5, 4}, halves.data(), halves.size() * 2, 3);
  convert_npy(dir.file("h.npy"), dir.file("y.npy"), dir.file("f16.h5"), {});
  expect_reads(dir.file("f16.h5"), {4}, DType::f16, value, label, 5, 2);
}

TEST(ConvertNpy, MalformedInputsNameTheFile) {
  test::TempDir dir("npy-bad");
  ByteData data;
  const std::string x = dir.file("x.npy"), y = dir.file("y.npy"), out = dir.file("o.h5");
  write_npy(y, "<i8", {7}, data.labels.data(), data.labels.size() * 8);
  auto convert = [&] { convert_npy(x, y, out, {}); };

  expect_contains(error_text(convert), {"NPY file '" + x + "' not found"});
  std::ofstream(x) << "x,y\n1,2\n";
  expect_contains(error_text(convert), {"'" + x + "' is not an NPY file"});
  write_npy(x, "|u1", {7, 2, 3}, data.pixels.data(), data.pixels.size(), 1, true);
  expect_contains(error_text(convert), {x, "Fortran"});
  write_npy(x, ">f4", {7, 6}, data.pixels.data(), data.pixels.size());
  expect_contains(error_text(convert), {x, "big-endian"});
  write_npy(x, "<i2", {7, 3}, data.pixels.data(), 42);
  expect_contains(error_text(convert), {x, "'<i2'", "uint8"});
  write_npy(x, "|u1", {42}, data.pixels.data(), 42);
  expect_contains(error_text(convert), {x, "(42)", "at least 2 dimensions"});
  write_npy(x, "|u1", {7, 2, 3}, data.pixels.data(), data.pixels.size(), 1, false, 5);
  expect_contains(error_text(convert), {x, "truncated", "(7,2,3)"});
  write_npy(x, "|u1", {6, 7}, data.pixels.data(), 42);
  expect_contains(error_text(convert), {y, "7 labels", "6 samples"});
  write_npy(x, "|u1", {7, 2, 3}, data.pixels.data(), data.pixels.size());
  std::vector<float> float_labels(7, 1.0f);
  write_npy(y, "<f4", {7}, float_labels.data(), 28);
  expect_contains(error_text(convert), {y, "'<f4'", "integers"});
  std::vector<std::int32_t> negative{0, 1, -3, 0, 0, 0, 0};
  write_npy(y, "<i4", {7}, negative.data(), 28);
  expect_contains(error_text(convert), {y, "label -3 at index 2"});
  std::vector<std::int32_t> labels{0, 1, 2, 0, 9, 0, 0};
  write_npy(y, "<i4", {7}, labels.data(), 28);
  ArrayConvertOptions options;
  options.num_classes = 5;
  expect_contains(error_text([&] { convert_npy(x, y, out, options); }), {y, "label 9 at index 4", "--classes"});
  options = ArrayConvertOptions{};
  options.sample_shape = {5};
  expect_contains(error_text([&] { convert_npy(x, y, out, options); }), {x, "--shape (5)", "6"});
  EXPECT_FALSE(std::filesystem::exists(out)) << "a failed conversion left a file behind";
}

TEST(ConvertCsv, HeaderLabelColumnAndUint8Detection) {
  test::TempDir dir("csv-u8");
  std::ofstream(dir.file("a.csv")) << "p0,p1,label,p3\n"
                                      "0,255,2,7\r\n"
                                      "\n"
                                      "10, 20 ,0,30\n"
                                      "1,2,1,3\n";
  ArrayConvertOptions options;
  options.label_column = 2;
  convert_csv(dir.file("a.csv"), dir.file("a.h5"), options);
  const float values[3][3] = {{0, 255, 7}, {10, 20, 30}, {1, 2, 3}};
  const int labels[3] = {2, 0, 1};
  expect_reads(dir.file("a.h5"), {3}, DType::u8, [&](int i, int e) { return values[i][e]; },
               [&](int i) { return labels[i]; }, 3, 3);
  // The last column as the label, --shape, no header, and a non-byte value makes it float32.
  std::ofstream(dir.file("b.csv")) << "0.5,1,2,3,4\n-1,2,3,4e1,0\n";
  options = ArrayConvertOptions{};
  options.label_column = -1;
  options.sample_shape = {2, 2};
  convert_csv(dir.file("b.csv"), dir.file("b.h5"), options);
  const float floats[2][4] = {{0.5f, 1, 2, 3}, {-1, 2, 3, 40}};
  expect_reads(dir.file("b.h5"), {2, 2}, DType::f32, [&](int i, int e) { return floats[i][e]; },
               [](int i) { return i == 0 ? 4 : 0; }, 2, 5);
  // --header=yes drops a numeric first line; --header=no keeps it.
  std::ofstream(dir.file("c.csv")) << "1,2,3\n0,4,5\n";
  options = ArrayConvertOptions{};
  options.header = "yes";
  convert_csv(dir.file("c.csv"), dir.file("c.h5"), options);
  EXPECT_EQ(DatasetReader(dir.file("c.h5"), {}).info().num_samples, 1);
  options.header = "no";
  convert_csv(dir.file("c.csv"), dir.file("c.h5"), options);
  EXPECT_EQ(DatasetReader(dir.file("c.h5"), {}).info().num_samples, 2);
}

TEST(ConvertCsv, MalformedInputsNameFileLineAndColumn) {
  test::TempDir dir("csv-bad");
  const std::string path = dir.file("bad.csv"), out = dir.file("o.h5");
  auto convert = [&](ArrayConvertOptions options = {}) {
    return error_text([&] { convert_csv(path, out, options); });
  };
  expect_contains(convert(), {"CSV file '" + path + "' not found"});
  std::ofstream(path) << "1,2,3\n0,4\n";
  expect_contains(convert(), {path, "line 2 has 2 columns", "first row has 3"});
  std::ofstream(path) << "1,2,3\n0,x,5\n";
  expect_contains(convert(), {path, "line 2, column 1", "'x' is not a finite number"});
  std::ofstream(path) << "1,2,3\n0,nan,5\n";
  expect_contains(convert(), {path, "line 2, column 1", "'nan'"});
  std::ofstream(path) << "1.5,2,3\n";
  expect_contains(convert(), {path, "line 1, label column 0", "'1.5'", "--label-column"});
  std::ofstream(path) << "-1,2,3\n";
  expect_contains(convert(), {path, "'-1' is not a class index"});
  std::ofstream(path) << "a,b\n";
  expect_contains(convert(), {path, "holds no samples"});
  std::ofstream(path) << "7\n";
  expect_contains(convert(), {path, "line 1 has 1 column"});
  std::ofstream(path) << "1,2,3\n";
  ArrayConvertOptions options;
  options.label_column = 3;
  expect_contains(convert(options), {"--label-column 3", path});
  options = ArrayConvertOptions{};
  options.header = "maybe";
  expect_contains(convert(options), {"--header 'maybe'"});
  options = ArrayConvertOptions{};
  options.sample_shape = {3};
  expect_contains(convert(options), {path, "--shape (3)"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(Synthetic, FloatDtypesStorePixelsOver255) {
  test::TempDir dir("synthetic-dtype");
  for (DType dtype : {DType::u8, DType::f32, DType::f16}) {
    SyntheticSpec spec;
    spec.train_samples = 50;
    spec.test_samples = 5;
    spec.dtype = dtype;
    const std::string out = dir.file(dtype_name(dtype));
    prepare_synthetic(spec, out);
    DatasetReader reader(out + "/train.h5", {});
    EXPECT_EQ(reader.info().sample_dtype, dtype);
  }
  // The float files hold the uint8 file's pixels / 255 (float16: to its precision).
  DatasetReader bytes(dir.file(dtype_name(DType::u8)) + "/train.h5", {});
  DatasetReader floats(dir.file(dtype_name(DType::f32)) + "/train.h5", {});
  DatasetReader halves(dir.file(dtype_name(DType::f16)) + "/train.h5", {});
  const std::vector<std::int64_t> indices{3, 41};
  Tensor a({2, 1, 28, 28}, DType::f32), b({2, 1, 28, 28}, DType::f32), c({2, 1, 28, 28}, DType::f32);
  Tensor la({2}, DType::i32), lb({2}, DType::i32), lc({2}, DType::i32);
  bytes.read_batch(indices, a, la);
  floats.read_batch(indices, b, lb);
  halves.read_batch(indices, c, lc);
  const float mean = bytes.info().mean, std = bytes.info().std;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const float pixel = a.data<float>()[i] * std + mean;  // back to x / 255
    ASSERT_NEAR(b.data<float>()[i], pixel, 1e-5);
    ASSERT_NEAR(c.data<float>()[i], pixel, 1e-3);
  }
  EXPECT_EQ(la.data<std::int32_t>()[1], lb.data<std::int32_t>()[1]);
}

}  // namespace
}  // namespace mpt::data
