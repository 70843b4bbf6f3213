// Tests of the IDX converter on small IDX files written here (raw and gzip), checked through
// the reader, and of every user error it reports.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <fstream>

#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

constexpr std::uint32_t kImages = 0x00000803, kLabels = 0x00000801;

std::vector<std::uint8_t> idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                                    const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> bytes;
  auto put = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      bytes.push_back(static_cast<std::uint8_t>(v >> shift));
  };
  put(magic);
  for (auto d : dims) put(d);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile out = gzopen(path.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(out);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
}

// N images of 4x3 pixels with known values, and labels i % 3.
struct SmallIdx {
  static constexpr std::uint32_t n = 7, rows = 4, columns = 3;
  std::vector<std::uint8_t> pixels, labels;
  SmallIdx() {
    for (std::uint32_t i = 0; i < n * rows * columns; ++i)
      pixels.push_back(static_cast<std::uint8_t>((i * 37) % 256));
    for (std::uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<std::uint8_t>(i % 3));
  }
  void write(const test::TempDir& dir, bool gzip, const std::string& suffix = "") const {
    write_file(dir.file("images" + suffix), idx_bytes(kImages, {n, rows, columns}, pixels), gzip);
    write_file(dir.file("labels" + suffix), idx_bytes(kLabels, {n}, labels), gzip);
  }
};

void check_converted(const std::string& path, const SmallIdx& idx) {
  DatasetReader reader(path, {});
  const DatasetInfo& info = reader.info();
  ASSERT_EQ(info.num_samples, SmallIdx::n);
  EXPECT_EQ(info.sample_shape, (Shape{1, SmallIdx::rows, SmallIdx::columns}));
  EXPECT_EQ(info.sample_dtype, DType::u8);
  EXPECT_EQ(info.num_classes, 3);
  // mean/std computed from the pixels (population statistics of x/255).
  double sum = 0, sum_sq = 0;
  for (auto p : idx.pixels) sum += p / 255.0, sum_sq += (p / 255.0) * (p / 255.0);
  const double mean = sum / idx.pixels.size();
  const double std = std::sqrt(sum_sq / idx.pixels.size() - mean * mean);
  EXPECT_NEAR(info.mean, mean, 1e-6);
  EXPECT_NEAR(info.std, std, 1e-6);

  std::vector<std::int64_t> indices{6, 0, 3, 1, 2, 5, 4};
  const std::int64_t elements = SmallIdx::rows * SmallIdx::columns;
  Tensor samples({7, 1, SmallIdx::rows, SmallIdx::columns}, DType::f32);
  Tensor labels({7}, DType::i32);
  reader.read_batch(indices, samples, labels);
  for (std::size_t p = 0; p < indices.size(); ++p) {
    EXPECT_EQ(labels.data<std::int32_t>()[p], idx.labels[static_cast<std::size_t>(indices[p])]);
    for (std::int64_t e = 0; e < elements; ++e) {
      const double x = idx.pixels[static_cast<std::size_t>(indices[p] * elements + e)];
      EXPECT_NEAR(samples.data<float>()[p * elements + e], (x / 255.0 - mean) / std, 1e-4);
    }
  }
}

TEST(ConvertIdx, RawFiles) {
  test::TempDir dir("idx-raw");
  SmallIdx idx;
  idx.write(dir, false);
  IdxConvertOptions options;
  options.num_classes = 3;
  convert_idx(dir.file("images"), dir.file("labels"), dir.file("out.h5"), options);
  check_converted(dir.file("out.h5"), idx);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.h5.tmp")));
}

TEST(ConvertIdx, GzipFilesAndSuffixFallback) {
  test::TempDir dir("idx-gzip");
  SmallIdx idx;
  idx.write(dir, true, ".gz");
  IdxConvertOptions options;
  options.num_classes = 3;
  options.mean = 0.5f;  // given statistics are written as they are
  options.std = 0.25f;
  // Named without .gz: the converter finds the .gz file.
  convert_idx(dir.file("images"), dir.file("labels"), dir.file("out.h5"), options);
  DatasetReader reader(dir.file("out.h5"), {});
  EXPECT_EQ(reader.info().mean, 0.5f);
  EXPECT_EQ(reader.info().std, 0.25f);
  options = IdxConvertOptions{};
  options.num_classes = 3;
  convert_idx(dir.file("images.gz"), dir.file("labels.gz"), dir.file("out2.h5"), options);
  check_converted(dir.file("out2.h5"), idx);
}

TEST(ConvertIdx, MissingFileNamesItWithHint) {
  test::TempDir dir("idx-missing");
  const std::string text = test::user_error_text(
      [&] { convert_idx(dir.file("nope-images"), dir.file("nope-labels"), dir.file("o.h5"), {}); });
  EXPECT_NE(text.find("not found"), std::string::npos) << text;
  EXPECT_NE(text.find("nope-"), std::string::npos) << text;
  EXPECT_NE(text.find("dataset-fashion-mnist"), std::string::npos) << text;
  EXPECT_NE(text.find("--source"), std::string::npos) << text;
}

TEST(ConvertIdx, BadMagicNamesTheFile) {
  test::TempDir dir("idx-magic");
  SmallIdx idx;
  idx.write(dir, false);
  IdxConvertOptions options;
  options.num_classes = 3;
  // Images and labels swapped.
  const std::string text = test::user_error_text(
      [&] { convert_idx(dir.file("labels"), dir.file("images"), dir.file("o.h5"), options); });
  EXPECT_NE(text.find("magic"), std::string::npos) << text;
  EXPECT_NE(text.find(dir.file("images")), std::string::npos) << text;
  EXPECT_NE(text.find("0x00000801"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(dir.file("o.h5")));
}

TEST(ConvertIdx, TruncatedRawAndGzipFilesAreRejected) {
  for (bool gzip : {false, true}) {
    test::TempDir dir(gzip ? "idx-trunc-gz" : "idx-trunc");
    SmallIdx idx;
    auto images = idx_bytes(kImages, {SmallIdx::n, SmallIdx::rows, SmallIdx::columns}, idx.pixels);
    write_file(dir.file("labels"), idx_bytes(kLabels, {SmallIdx::n}, idx.labels), false);
    if (gzip) {
      // A gzip stream cut in the middle.
      write_file(dir.file("full.gz"), images, true);
      std::ifstream in(dir.file("full.gz"), std::ios::binary);
      std::vector<char> compressed((std::istreambuf_iterator<char>(in)), {});
      compressed.resize(compressed.size() * 2 / 3);
      std::ofstream(dir.file("images.gz"), std::ios::binary)
          .write(compressed.data(), static_cast<std::streamsize>(compressed.size()));
    } else {
      images.resize(images.size() - 10);
      write_file(dir.file("images"), images, false);
    }
    IdxConvertOptions options;
    options.num_classes = 3;
    const std::string image_path = dir.file(gzip ? "images.gz" : "images");
    const std::string text = test::user_error_text(
        [&] { convert_idx(image_path, dir.file("labels"), dir.file("o.h5"), options); });
    EXPECT_TRUE(text.find("truncated") != std::string::npos ||
                text.find("corrupt") != std::string::npos)
        << text;
    EXPECT_NE(text.find(image_path), std::string::npos) << text;
    // No half-written output remains, under either name.
    EXPECT_FALSE(std::filesystem::exists(dir.file("o.h5")));
    EXPECT_FALSE(std::filesystem::exists(dir.file("o.h5.tmp")));
  }
}

TEST(ConvertIdx, CountMismatchNamesBothFiles) {
  test::TempDir dir("idx-count");
  SmallIdx idx;
  write_file(dir.file("images"),
             idx_bytes(kImages, {SmallIdx::n, SmallIdx::rows, SmallIdx::columns}, idx.pixels),
             false);
  std::vector<std::uint8_t> fewer(idx.labels.begin(), idx.labels.end() - 2);
  write_file(dir.file("labels"), idx_bytes(kLabels, {SmallIdx::n - 2}, fewer), false);
  IdxConvertOptions options;
  options.num_classes = 3;
  const std::string text = test::user_error_text(
      [&] { convert_idx(dir.file("images"), dir.file("labels"), dir.file("o.h5"), options); });
  EXPECT_NE(text.find(dir.file("images")), std::string::npos) << text;
  EXPECT_NE(text.find(dir.file("labels")), std::string::npos) << text;
  EXPECT_NE(text.find("7 images"), std::string::npos) << text;
}

TEST(ConvertIdx, LabelOutsideClassCountIsRejected) {
  test::TempDir dir("idx-label");
  SmallIdx idx;
  idx.write(dir, false);
  IdxConvertOptions options;
  options.num_classes = 2;  // labels go up to 2
  const std::string text = test::user_error_text(
      [&] { convert_idx(dir.file("images"), dir.file("labels"), dir.file("o.h5"), options); });
  EXPECT_NE(text.find(dir.file("labels")), std::string::npos) << text;
  EXPECT_NE(text.find("label 2 at index 2"), std::string::npos) << text;
}

}  // namespace
}  // namespace mpt::data
