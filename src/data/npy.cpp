// `mptrain prepare npy`: a pair of NumPy .npy files (samples and labels) to an mptrain data file.
// The NPY header is parsed here (a tiny subset of Python literal syntax), so no Python is needed.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace {

constexpr const char* kNpyHint =
    "write it with numpy.save from a C-ordered, little-endian array, e.g. "
    "np.save(path, np.ascontiguousarray(x, dtype='<f4'))";

// What the header of one .npy file says, and where its data start.
struct NpyHeader {
  char byte_order = '|';  // '<', '>', '|' (not applicable) or '='
  char kind = '?';        // 'u', 'i', 'f', ...
  std::size_t item_size = 0;
  std::string descr;
  Shape shape;
  std::uint64_t data_offset = 0;
};

// The value text after 'KEY': in a header dict, up to the next top-level comma or brace.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  std::size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) at = header.find("\"" + key + "\"");
  MPT_REQUIRE(at != std::string::npos,
              "NPY file '" + path + "' has no '" + key + "' in its header: " + header, kNpyHint);
  at = header.find(':', at);
  MPT_REQUIRE(at != std::string::npos, "NPY file '" + path + "' has a malformed header: " + header,
              kNpyHint);
  ++at;
  int depth = 0;
  std::size_t end = at;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth < 0 || (depth == 0 && (c == ',' || c == '}'))) break;
  }
  std::string value = header.substr(at, end - at);
  const auto first = value.find_first_not_of(" \t");
  const auto last = value.find_last_not_of(" \t");
  return first == std::string::npos ? "" : value.substr(first, last - first + 1);
}

NpyHeader read_npy_header(std::ifstream& in, const std::string& path) {
  namespace fs = std::filesystem;
  MPT_REQUIRE(fs::exists(path), "NPY file '" + path + "' not found", "check the path");
  MPT_REQUIRE(in.good(), "cannot open NPY file '" + path + "'", "check its permissions");
  char prefix[8] = {};
  in.read(prefix, 8);
  MPT_REQUIRE(in.gcount() == 8 && std::memcmp(prefix, "\x93NUMPY", 6) == 0,
              "'" + path + "' is not an NPY file (no \\x93NUMPY magic at its start)",
              "pass files written by numpy.save (.npy, not .npz or text)");
  const int major = static_cast<unsigned char>(prefix[6]);
  MPT_REQUIRE(major >= 1 && major <= 3,
              "NPY file '" + path + "' has format version " + std::to_string(major) + "." +
                  std::to_string(static_cast<unsigned char>(prefix[7])) +
                  "; versions 1.0, 2.0 and 3.0 are read",
              kNpyHint);
  std::uint32_t header_length = 0;
  unsigned char length_bytes[4] = {};
  const std::streamsize length_size = major == 1 ? 2 : 4;
  in.read(reinterpret_cast<char*>(length_bytes), length_size);
  MPT_REQUIRE(in.gcount() == length_size, "NPY file '" + path + "' is truncated in its header",
              kNpyHint);
  for (std::streamsize i = length_size - 1; i >= 0; --i)
    header_length = (header_length << 8) | length_bytes[i];
  MPT_REQUIRE(header_length < (1u << 24), "NPY file '" + path + "' declares a header of " +
                                              std::to_string(header_length) + " bytes",
              kNpyHint);
  std::string header(header_length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  MPT_REQUIRE(in.gcount() == static_cast<std::streamsize>(header_length),
              "NPY file '" + path + "' is truncated in its header", kNpyHint);

  NpyHeader result;
  result.data_offset = static_cast<std::uint64_t>(8 + length_size) + header_length;
  const std::string fortran = dict_value(header, "fortran_order", path);
  MPT_REQUIRE(fortran == "False",
              "NPY file '" + path + "' is in Fortran (column-major) order; only C order is read",
              "save np.ascontiguousarray(x) instead of a transposed or Fortran-ordered array");
  std::string descr = dict_value(header, "descr", path);
  MPT_REQUIRE(descr.size() >= 4 && (descr.front() == '\'' || descr.front() == '"') &&
                  descr.back() == descr.front(),
              "NPY file '" + path + "' has dtype " + descr +
                  ", a structured or unknown type; plain numeric arrays are read",
              kNpyHint);
  descr = descr.substr(1, descr.size() - 2);
  result.descr = descr;
  result.byte_order = descr[0];
  result.kind = descr[1];
  {
    char* end = nullptr;
    const long size = std::strtol(descr.c_str() + 2, &end, 10);
    MPT_REQUIRE(end && *end == '\0' && size > 0 && size <= 16,
                "NPY file '" + path + "' has dtype '" + descr + "', which is not a plain number",
                kNpyHint);
    result.item_size = static_cast<std::size_t>(size);
  }
  MPT_REQUIRE(result.byte_order != '>' || result.item_size == 1,
              "NPY file '" + path + "' is big-endian (dtype '" + descr + "')",
              "convert it: np.save(path, x.astype(x.dtype.newbyteorder('<')))");

  std::string shape_text = dict_value(header, "shape", path);
  MPT_REQUIRE(shape_text.size() >= 2 && shape_text.front() == '(' && shape_text.back() == ')',
              "NPY file '" + path + "' has a malformed shape " + shape_text, kNpyHint);
  shape_text = shape_text.substr(1, shape_text.size() - 2);
  std::size_t begin = 0;
  while (begin < shape_text.size()) {
    std::size_t end = shape_text.find(',', begin);
    if (end == std::string::npos) end = shape_text.size();
    std::string item = shape_text.substr(begin, end - begin);
    item.erase(std::remove_if(item.begin(), item.end(), [](char c) { return c == ' ' || c == 'L'; }),
               item.end());
    begin = end + 1;
    if (item.empty()) continue;  // the trailing comma of a 1-tuple
    char* parsed_end = nullptr;
    const long long extent = std::strtoll(item.c_str(), &parsed_end, 10);
    MPT_REQUIRE(parsed_end && *parsed_end == '\0' && extent >= 0,
                "NPY file '" + path + "' has a malformed shape (" + shape_text + ")", kNpyHint);
    result.shape.push_back(extent);
  }
  // Every partial product of the extents (what shape_numel computes) must stay far from overflow;
  // the data's size is checked against the file later.
  std::uint64_t bytes = result.item_size;
  for (const auto extent : result.shape) {
    MPT_REQUIRE(extent == 0 || bytes <= (std::uint64_t{1} << 62) / static_cast<std::uint64_t>(extent),
                "NPY file '" + path + "' declares shape (" + shape_text + ") of '" + descr +
                    "', more data than any file holds",
                "the header is damaged; save or copy the file again");
    bytes *= static_cast<std::uint64_t>(extent);
  }
  return result;
}

// Checks that PATH holds exactly the data its header announces.
void require_data_size(const std::string& path, const NpyHeader& header) {
  const auto elements = static_cast<std::uint64_t>(shape_numel(header.shape));
  const std::uint64_t expected = header.data_offset + elements * header.item_size;
  const std::uint64_t actual = std::filesystem::file_size(path);
  MPT_REQUIRE(actual >= expected,
              "NPY file '" + path + "' is truncated: its header announces shape " +
                  shape_to_string(header.shape) + " of '" + header.descr + "' (" +
                  std::to_string(expected) + " bytes with the header) but it has " +
                  std::to_string(actual) + " bytes",
              "the file is incomplete; save or copy it again");
  MPT_REQUIRE(actual == expected,
              "NPY file '" + path + "' has " + std::to_string(actual - expected) +
                  " bytes after the data its header announces",
              "pass a plain .npy file written by numpy.save");
}

// Reads labels of any little-endian integer dtype as int64.
std::vector<std::int64_t> read_labels(std::ifstream& in, const std::string& path,
                                      const NpyHeader& header) {
  const std::size_t n = static_cast<std::size_t>(header.shape.at(0));
  std::vector<unsigned char> raw(n * header.item_size);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
  MPT_REQUIRE(in.gcount() == static_cast<std::streamsize>(raw.size()),
              "NPY file '" + path + "' is truncated", "save or copy it again");
  std::vector<std::int64_t> labels(n);
  const bool is_signed = header.kind == 'i';
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t bits = 0;
    for (std::size_t b = 0; b < header.item_size; ++b)
      bits |= static_cast<std::uint64_t>(raw[i * header.item_size + b]) << (8 * b);
    if (is_signed && header.item_size < 8 && (bits >> (8 * header.item_size - 1)) & 1)
      bits |= ~std::uint64_t{0} << (8 * header.item_size);  // sign-extend
    labels[i] = static_cast<std::int64_t>(bits);
    MPT_REQUIRE(labels[i] >= 0 && labels[i] <= std::numeric_limits<std::int32_t>::max() &&
                    !(header.kind == 'u' && header.item_size == 8 && (bits >> 63)),
                "NPY file '" + path + "': label " + std::to_string(labels[i]) + " at index " +
                    std::to_string(i) + " is not a class index (0, 1, 2, ...)",
                "labels must be non-negative integers");
  }
  return labels;
}

}  // namespace

void convert_npy(const std::string& samples_path, const std::string& labels_path,
                 const std::string& out_path, const ArrayConvertOptions& options) {
  std::ifstream samples_in(samples_path, std::ios::binary);
  const NpyHeader samples = read_npy_header(samples_in, samples_path);
  std::ifstream labels_in(labels_path, std::ios::binary);
  const NpyHeader labels = read_npy_header(labels_in, labels_path);

  DType dtype = DType::u8;
  if (samples.kind == 'u' && samples.item_size == 1)
    dtype = DType::u8;
  else if (samples.kind == 'f' && samples.item_size == 4)
    dtype = DType::f32;
  else if (samples.kind == 'f' && samples.item_size == 2)
    dtype = DType::f16;
  else
    throw_user_error("NPY file '" + samples_path + "' (--samples) has dtype '" + samples.descr +
                         "'; samples must be uint8 ('|u1'), float16 ('<f2') or float32 ('<f4')",
                     "convert it, e.g. np.save(path, x.astype(np.float32))");
  MPT_REQUIRE(samples.shape.size() >= 2 && samples.shape[0] > 0,
              "NPY file '" + samples_path + "' (--samples) has shape " +
                  shape_to_string(samples.shape) + "; samples must be (N, ...) with N >= 1 and "
                  "at least 2 dimensions",
              "store one sample per row, e.g. (N, 784) or (N, 1, 28, 28)");
  MPT_REQUIRE((labels.kind == 'i' || labels.kind == 'u') &&
                  (labels.item_size == 1 || labels.item_size == 2 || labels.item_size == 4 ||
                   labels.item_size == 8),
              "NPY file '" + labels_path + "' (--labels) has dtype '" + labels.descr +
                  "'; labels must be integers ('<i4', '<i8', '|u1', ...)",
              "convert them, e.g. np.save(path, y.astype(np.int64))");
  MPT_REQUIRE(labels.shape.size() == 1,
              "NPY file '" + labels_path + "' (--labels) has shape " +
                  shape_to_string(labels.shape) + "; labels must be one-dimensional, (N,)",
              "store one class index per sample, e.g. y.reshape(-1)");
  MPT_REQUIRE(labels.shape[0] == samples.shape[0],
              "NPY file '" + labels_path + "' (--labels) has " + std::to_string(labels.shape[0]) +
                  " labels but '" + samples_path + "' (--samples) has " +
                  std::to_string(samples.shape[0]) + " samples",
              "samples and labels must have the same length N");
  require_data_size(samples_path, samples);
  require_data_size(labels_path, labels);

  const std::vector<std::int64_t> label_values = read_labels(labels_in, labels_path, labels);
  const std::int64_t max_label = *std::max_element(label_values.begin(), label_values.end());
  if (options.num_classes > 0)
    for (std::size_t i = 0; i < label_values.size(); ++i)
      MPT_REQUIRE(label_values[i] < options.num_classes,
                  "NPY file '" + labels_path + "': label " + std::to_string(label_values[i]) +
                      " at index " + std::to_string(i) + " is outside [0, " +
                      std::to_string(options.num_classes) + ") given by --classes",
                  "raise --classes or leave it out (then it is the largest label + 1)");
  const std::vector<std::int32_t> label32(label_values.begin(), label_values.end());

  const Shape stored(samples.shape.begin() + 1, samples.shape.end());
  MPT_REQUIRE(shape_numel(stored) > 0,
              "NPY file '" + samples_path + "' (--samples) has shape " +
                  shape_to_string(samples.shape) + ": its samples are empty",
              "every sample needs at least one element, e.g. (N, 784)");
  const Shape shape = detail::converted_sample_shape(stored, options.sample_shape,
                                                     "'" + samples_path + "'");
  detail::create_parent_directory(out_path);
  const std::int64_t n = samples.shape[0];
  const std::size_t sample_bytes = static_cast<std::size_t>(shape_numel(stored)) * samples.item_size;
  const std::int64_t slab =
      std::max<std::int64_t>(1, static_cast<std::int64_t>((4u << 20) / sample_bytes));
  std::vector<unsigned char> buffer(static_cast<std::size_t>(std::min(slab, n)) * sample_bytes);
  detail::DataFileWriter writer(out_path, n, shape, dtype);
  detail::PixelStatistics statistics;
  for (std::int64_t begin = 0; begin < n; begin += slab) {
    const std::int64_t count = std::min(slab, n - begin);
    const auto bytes = static_cast<std::streamsize>(static_cast<std::size_t>(count) * sample_bytes);
    samples_in.read(reinterpret_cast<char*>(buffer.data()), bytes);
    MPT_REQUIRE(samples_in.gcount() == bytes, "NPY file '" + samples_path + "' is truncated",
                "save or copy it again");
    if (dtype == DType::u8) statistics.add(buffer.data(), static_cast<std::size_t>(bytes));
    writer.append(buffer.data(), dtype, label32.data() + begin, count);
  }
  writer.finish(detail::converted_attributes(
      options, max_label, dtype, statistics,
      "npy: samples '" + samples_path + "', labels '" + labels_path + "'"));
}

}  // namespace mpt::data
