// Conversion of IDX files (the MNIST family's format: big-endian magic, dimensions, raw uint8) to
// mptrain data files. Reads through zlib's gz* API, which reads gzip and plain files alike.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr const char* kSourceHint = "install Debian's dataset-fashion-mnist or pass --source DIR";

// PATH if it exists, else the same name with ".gz" added or removed, so both the compressed and
// the uncompressed distribution are accepted.
std::string resolve_source(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) return path;
  const bool compressed = path.size() > 3 && path.ends_with(".gz");
  const std::string other = compressed ? path.substr(0, path.size() - 3) : path + ".gz";
  if (fs::exists(other)) return other;
  throw_user_error("IDX file '" + path + "' not found", kSourceHint);
}

std::string hex32(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

class IdxStream {
 public:
  explicit IdxStream(std::string path) : path_(std::move(path)) {
    gz_ = gzopen(path_.c_str(), "rb");
    MPT_REQUIRE(gz_ != nullptr, "cannot open IDX file '" + path_ + "'",
                "check the file's permissions");
  }
  ~IdxStream() {
    if (gz_) gzclose(gz_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t consumed() const { return consumed_; }

  // Reads exactly BYTES bytes or throws a UserError saying the file is truncated (or corrupt).
  void read_exact(void* out, std::size_t bytes, const std::string& what) {
    auto* cursor = static_cast<unsigned char*>(out);
    while (bytes > 0) {
      const unsigned piece = static_cast<unsigned>(std::min<std::size_t>(bytes, 1u << 30));
      const int got = gzread(gz_, cursor, piece);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(gz_, &code);
        throw_user_error("IDX file '" + path_ + "' is corrupt while reading " + what + ": " +
                             (message ? message : "zlib error"),
                         "re-download the file or reinstall dataset-fashion-mnist");
      }
      consumed_ += static_cast<std::uint64_t>(got);
      if (static_cast<unsigned>(got) < piece)
        throw_user_error("IDX file '" + path_ + "' is truncated: it ends after " +
                             std::to_string(consumed_) + " bytes, inside " + what,
                         "the file (or its .gz) is incomplete; re-download it or reinstall "
                         "dataset-fashion-mnist");
      cursor += got;
      bytes -= static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_big_endian_u32(const std::string& what) {
    unsigned char bytes[4];
    read_exact(bytes, 4, what);
    return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
           (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
  }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
  std::uint64_t consumed_ = 0;
};

void check_magic(IdxStream& stream, std::uint32_t expected, const char* kind) {
  const std::uint32_t magic = stream.read_big_endian_u32("the header");
  MPT_REQUIRE(magic == expected,
              "'" + stream.path() + "' is not an IDX " + kind + " file: magic number " +
                  hex32(magic) + ", expected " + hex32(expected),
              "pass the *-images-idx3-ubyte file as images and the *-labels-idx1-ubyte file as "
              "labels");
}

}  // namespace

void convert_idx(const std::string& images_path, const std::string& labels_path,
                 const std::string& out_path, const IdxConvertOptions& options) {
  MPT_REQUIRE(options.num_classes >= 1 && options.num_classes <= 256,
              "IDX conversion to '" + out_path + "': num_classes " +
                  std::to_string(options.num_classes) + " is outside [1, 256]",
              "IDX labels are bytes; use a class count between 1 and 256");
  IdxStream labels_stream(resolve_source(labels_path));
  IdxStream images_stream(resolve_source(images_path));

  check_magic(labels_stream, kLabelsMagic, "labels");
  const std::uint32_t label_count = labels_stream.read_big_endian_u32("the header");
  check_magic(images_stream, kImagesMagic, "images");
  const std::uint32_t image_count = images_stream.read_big_endian_u32("the header");
  const std::uint32_t rows = images_stream.read_big_endian_u32("the header");
  const std::uint32_t columns = images_stream.read_big_endian_u32("the header");

  MPT_REQUIRE(image_count == label_count,
              "IDX files disagree: '" + images_stream.path() + "' holds " +
                  std::to_string(image_count) + " images but '" + labels_stream.path() +
                  "' holds " + std::to_string(label_count) + " labels",
              "pass the images and labels of the same split (train with train, t10k with t10k)");
  MPT_REQUIRE(image_count > 0, "IDX file '" + images_stream.path() + "' holds no images",
              "use a non-empty data set");
  // 16 Mpixel (4096 x 4096) per image at most: far above any IDX data set, and the bound that
  // keeps a damaged header from making us allocate gigabytes for one image.
  MPT_REQUIRE(rows > 0 && columns > 0 && std::uint64_t{rows} * columns <= (std::uint64_t{1} << 24),
              "IDX file '" + images_stream.path() + "' has implausible image size " +
                  std::to_string(rows) + "x" + std::to_string(columns),
              "the header is damaged; re-download the file");

  // Labels are small (one byte per sample): read and validate them all before any output. They
  // are read in pieces, so that a header announcing billions of labels in a short (damaged) file
  // fails as truncated before it has cost gigabytes of memory.
  std::vector<std::uint8_t> label_bytes;
  for (std::size_t done = 0; done < label_count;) {
    const std::size_t piece = std::min<std::size_t>(label_count - done, 1u << 20);
    label_bytes.resize(done + piece);
    labels_stream.read_exact(label_bytes.data() + done, piece,
                             std::to_string(label_count) + " labels");
    done += piece;
  }
  std::vector<std::int32_t> labels(label_count);
  for (std::size_t i = 0; i < label_bytes.size(); ++i) {
    MPT_REQUIRE(label_bytes[i] < options.num_classes,
                "IDX file '" + labels_stream.path() + "': label " + std::to_string(label_bytes[i]) +
                    " at index " + std::to_string(i) + " is outside [0, " +
                    std::to_string(options.num_classes) + ")",
                "the file is damaged or is not a " + std::to_string(options.num_classes) +
                    "-class data set");
    labels[i] = label_bytes[i];
  }

  const Shape sample_shape{1, rows, columns};
  const std::size_t sample_bytes = std::size_t{rows} * columns;
  detail::DataFileWriter writer(out_path, image_count, sample_shape);
  detail::PixelStatistics statistics;
  const std::size_t slab = std::max<std::size_t>(1, (4u << 20) / sample_bytes);
  std::vector<std::uint8_t> pixels(slab * sample_bytes);
  for (std::size_t begin = 0; begin < image_count; begin += slab) {
    const std::size_t count = std::min<std::size_t>(slab, image_count - begin);
    images_stream.read_exact(pixels.data(), count * sample_bytes,
                             "images " + std::to_string(begin) + ".." +
                                 std::to_string(begin + count - 1) + " of " +
                                 std::to_string(image_count) + " (" + std::to_string(rows) + "x" +
                                 std::to_string(columns) + " pixels each)");
    statistics.add(pixels.data(), count * sample_bytes);
    writer.append(pixels.data(), labels.data() + begin, static_cast<std::int64_t>(count));
  }

  detail::DataFileAttributes attributes;
  attributes.num_classes = options.num_classes;
  attributes.mean = std::isnan(options.mean) ? statistics.mean() : options.mean;
  attributes.std = std::isnan(options.std) ? statistics.std() : options.std;
  attributes.source = options.source.empty()
                          ? "IDX files " + images_stream.path() + ", " + labels_stream.path()
                          : options.source;
  attributes.class_names = options.class_names;
  writer.finish(attributes);
}

}  // namespace mpt::data
